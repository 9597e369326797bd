"""MHA rows through plan_decode with and without the 3-stage MHA tile (plan.MHA_LONG_MIN_TOKENS 4096 / None),
alternated twice in one process (A B A B). Graph µs, caches rotated out of L2, every variant checked against the
float64 reference first. Writes $OUT/mha-plan.jsonl, prints a table last, then the registers and shared memory of
each compiled 128-token partial kernel (what decides how many programs share an SM).

    python scripts/mha_plan_probe.py

``--tile 32,3,p --min-tokens 2048`` times another long MHA tile instead (BLOCK_N, stages[, p: the page ids a tile
ahead], as triton_splitk.MHA_LONG_TILE takes it) from that chunk length, against the library as it is (A B A B).
"""

import argparse
import itertools

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, launcher, plan, plan_decode, triton_splitk
from flashdecode.bench import ProbeLog, Row, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense

ROWS = [
    # the anchor grid's MHA rows
    Row([65536], 12, 12), Row([16384] * 4, 12, 12), Row([4096] * 16, 12, 12), Row([1024] * 64, 12, 12),
    Row([131072], 12, 12),
    # 384-program grids of 4096-token chunks and longer (the rule's rows)
    Row([131072] * 2, 12, 12), Row([65536] * 2, 12, 12), Row([16384] * 8, 12, 12), Row([131072], 24, 24),
    Row([65536], 48, 48), Row([262144], 6, 6), Row([8192] * 16, 12, 12),
    # ...with lengths that are not powers of two, an even batch of mixed lengths, head dim 64, fp16
    Row([100000], 12, 12), Row([98304] * 2, 12, 12), Row([12000, 16000, 14000, 13000, 15000, 16384, 12500, 14500],
                                                          12, 12),
    Row([131072], 12, 12, head_dim=64), Row([131072], 12, 12, dtype="fp16"),
    # grids the rule leaves alone: 320 and 288 programs, 2048-token chunks
    Row([131072], 20, 20), Row([65536] * 3, 12, 12), Row([131072], 6, 6),
    # 1024-token chunks and 384-program grids of 2048
    Row([32768], 12, 12), Row([16384] * 2, 12, 12), Row([8192] * 8, 12, 12), Row([65536], 16, 16),
    Row([16384] * 4, 12, 12, dtype="fp16"), Row([4096] * 16, 12, 12, head_dim=64),
]  # fmt: skip


def _dtype(name):
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tile", default="", help="BLOCK_N,stages[,p]: the long MHA tile to time (default: the 3-stage "
                                               "128-token one against none)")  # fmt: skip
    ap.add_argument("--min-tokens", type=int, default=4096, help="MHA_LONG_MIN_TOKENS with that tile")
    args = ap.parse_args()
    base_tile = triton_splitk.MHA_LONG_TILE
    if args.tile:
        fields = args.tile.split(",")
        prefetch = fields[-1] == "p"
        block_n, stages = map(int, fields[:-1] if prefetch else fields)
        tile = dict(BLOCK_N=block_n, num_stages=stages, **({"PREFETCH_PAGES": True} if prefetch else {}))
        a_name, b_name = "library", args.tile
        variants = [(a_name, plan.MHA_LONG_MIN_TOKENS, base_tile), (b_name, args.min_tokens, tile)] * 2
    else:
        a_name, b_name = "2-stage", "3-stage"
        variants = [(a_name, None, base_tile), (b_name, args.min_tokens, base_tile)] * 2
    log = ProbeLog("mha-plan")
    l2 = _l2_bytes("cuda")
    threshold = plan.MHA_LONG_MIN_TOKENS
    for row in ROWS:
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, row.head_dim, 16, _dtype(row.dtype),
                              "cuda", spare_pages=0)  # fmt: skip
        ref, _ = reference_dense(*c.args, device="cuda")
        copies = rotation_copies(c, l2)
        times, notes = {}, {}
        for name, thr, tile in variants:
            plan.MHA_LONG_MIN_TOKENS = thr
            triton_splitk.MHA_LONG_TILE = tile
            launcher.clear()
            p = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
            notes[name] = f"S{p.num_splits}{'L' if p.long_tile else ''}"
            it = itertools.cycle(copies)

            def fn(p=p):
                x = next(it)
                return decode_attention(*x.args, plan=p)

            err = max_err(fn(), ref)
            assert err < 2e-2, f"{row.name()} {name}: wrong, err {err}"
            times.setdefault(name, []).append(do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3)
        plan.MHA_LONG_MIN_TOKENS = threshold
        triton_splitk.MHA_LONG_TILE = base_tile
        label = row.name()
        a, b = times[a_name], times[b_name]
        line = (f"{label:<32} {a_name} {' '.join(f'{t:6.1f}' for t in a)} ({notes[a_name]:>4})  {b_name} "
                f"{' '.join(f'{t:6.1f}' for t in b)} ({notes[b_name]:>4})  {min(b) / min(a) - 1:+6.1%}")
        log.row(dict(row=label, **{k: [round(t, 2) for t in v] for k, v in times.items()}, plans=notes), line)
    log.close()
    print()
    # what decides the programs per SM: registers per thread and shared memory of each compiled partial kernel
    for (block_n, stages, warps, pf), (regs, shared) in sorted(KERNELS.items()):
        print(f"partial kernel, {block_n} tokens: {stages} stages, {warps} warps, prefetch {pf}, {regs} registers, "
              f"{shared} B shared")


# (BLOCK_N, num_stages, num_warps, PREFETCH_PAGES) -> (registers, shared bytes) of the partial kernels launched
KERNELS = {}
_launch = triton_splitk.launch


def _noting(kernel, grid, *args, **kwargs):
    compiled = _launch(kernel, grid, *args, **kwargs)
    if kernel is triton_splitk._partial_kernel and compiled is not None:
        key = (kwargs.get("BLOCK_N"), kwargs.get("num_stages"), kwargs.get("num_warps"), kwargs.get("PREFETCH_PAGES"))
        KERNELS[key] = (getattr(compiled, "n_regs", None), getattr(compiled.metadata, "shared", None))
    return compiled


triton_splitk.launch = _noting

if __name__ == "__main__":
    main()
