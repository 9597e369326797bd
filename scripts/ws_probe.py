"""Triton's automatic warp specialization (``tl.range(warp_specialize=True)``, Hopper's autoWS pass in triton 3.6)
on the TMA backend's loop: does it compile, is it right, is it faster? For a few anchor rows: triton_splitk (the
plan, the library's fastest call) as the bar, triton_tma at its default, and triton_tma with WARP_SPEC at 4 and 8
warps. Every variant is checked against the float64 reference before it is timed (CUDA-graph median, caches rotated
out of L2). Writes $OUT/ws.jsonl, prints a table last.

    python scripts/ws_probe.py
"""

import itertools
import traceback

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, launcher, plan_decode, triton_tma
from flashdecode.bench import ProbeLog, Row, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense

ROWS = [Row([65536], 12, 2), Row([4096] * 16, 12, 2), Row([2048] * 8, 28, 4), Row([65536], 12, 12),
        Row([4096] * 64, 32, 8)]  # fmt: skip
# (name, config overrides of tma_config)
TMA_VARIANTS = [("tma", {}), ("tma_ws4", dict(WARP_SPEC=True)), ("tma_ws8", dict(WARP_SPEC=True, num_warps=8))]


def graph_us(copies, ref, label, fn_of):
    """Graph µs of fn_of(case) cycling through `copies`, once checked against `ref`."""
    launcher.clear()
    it = itertools.cycle(copies)

    def fn():
        return fn_of(next(it))

    err = max_err(fn(), ref)
    assert err < 0.05, f"{label}: wrong, err {err}"
    return do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3


def main():
    log = ProbeLog("ws")
    l2 = _l2_bytes("cuda")
    for row in ROWS:
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, 128, 16, torch.bfloat16, "cuda")
        ref, _ = reference_dense(c.q, c.k_cache.float(), c.v_cache.float(), *c.args[3:], device="cuda")
        copies = rotation_copies(c, l2)
        plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
        res = {"plan": graph_us(copies, ref, f"{row.name()} plan", lambda x: decode_attention(
            x.q, x.k_cache, x.v_cache, x.cache_seqlens, x.block_table, plan=plan))}
        for name, cfg in TMA_VARIANTS:
            def call(x, cfg=cfg):
                out = torch.empty_like(x.q)
                triton_tma.decode_tma(x.q, x.k_cache, x.v_cache, x.cache_seqlens, x.block_table,
                                      x.q.shape[-1] ** -0.5, out, config=cfg)  # fmt: skip
                return out

            try:
                res[name] = graph_us(copies, ref, f"{row.name()} {name}", call)
            except Exception as e:  # a compile failure of the autoWS pass is a result here, not a crash
                traceback.print_exc()
                res[name] = None
                print(f"{row.name()} {name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        line = f"{row.name():<22} " + "  ".join(
            f"{k} {v:7.1f}" if v is not None else f"{k}  failed" for k, v in res.items())
        log.row(dict(row=row.name(), **res), line)
    log.close()


if __name__ == "__main__":
    main()
