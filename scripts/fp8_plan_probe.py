"""fp8 split rows through `auto` and through plan_decode with the long fp8 tile's threshold at several lengths
(plan.FP8_LONG_MIN_TOKENS), and the fused merge's fp8 tile at the planner targets 2 and 4. Graph µs, caches rotated
out of L2, every variant checked against the float64 reference first. Writes $OUT/fp8-plan.jsonl, prints a table.

    python scripts/fp8_plan_probe.py
    python scripts/fp8_plan_probe.py short   # rows of short chunks, lower thresholds
    python scripts/fp8_plan_probe.py target  # the fp8 tile's planner target, 2 or 3 programs per SM
"""

import itertools
import sys

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, launcher, plan, plan_decode, triton_splitk
from flashdecode.bench import FP8_K_SCALE, FP8_V_SCALE, ProbeLog, Row, _l2_bytes, quantize_kv, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense

ROWS = [
    Row([131072], 32, 8), Row([16384] * 4, 32, 8), Row([8192] * 8, 32, 8), Row([65536], 12, 2),
    Row([131072], 12, 2), Row([16384] * 4, 12, 2), Row([4096] * 16, 12, 2), Row([2048] * 8, 28, 4),
    Row([2048], 28, 4), Row([8192], 28, 4), Row([1024] * 64, 12, 2), Row([2048] * 40, 32, 8),
    Row([131072] + [1024] * 63, 32, 8),
]  # fmt: skip
# (name, plan threshold or "auto", the fused tile's planner target)
VARIANTS = [("auto", "auto", 2), ("auto_s4", "auto", 4), ("plan_never", None, 2), ("plan_512", 512, 2),
            ("plan_1024", 1024, 2), ("plan_2048", 2048, 2)]  # fmt: skip
# `fp8_plan_probe.py short`: at 26cef0b every row whose long-tile chunks were >= 512 tokens gained (1 x 65536 12/2
# 19.1 -> 17.4 us, 16 x 4096 12/2 22.8 -> 18.9); shorter chunks, thresholds 128 and 256
SHORT_ROWS = [
    Row([2048] * 8, 28, 4), Row([2048], 28, 4), Row([8192], 28, 4), Row([4096] * 2, 12, 2), Row([1024] * 8, 28, 4),
    Row([1024] * 32, 12, 2), Row([2048] * 16, 12, 2), Row([4096] * 4, 32, 8), Row([512] * 64, 12, 2),
    Row([4096] * 16, 12, 2), Row([65536], 12, 2),
]  # fmt: skip
SHORT_VARIANTS = [("auto", "auto", 2), ("plan_never", None, 2), ("plan_128", 128, 2), ("plan_256", 256, 2),
                  ("plan_512", 512, 2)]  # fmt: skip
# `fp8_plan_probe.py target`: the fp8_long planner target 2 against 3. Run at 6889bb1, where the fp8 tiles were
# converted in inline PTX (fp8_to_f16, reverted): 166 registers instead of 199, so 3 programs fit an SM
TARGET_ROWS = [
    Row([131072], 32, 8), Row([8192] * 8, 32, 8), Row([16384] * 4, 12, 2), Row([4096] * 16, 12, 2),
    Row([1024] * 32, 12, 2), Row([2048] * 8, 28, 4), Row([65536], 12, 2), Row([1024] * 64, 12, 2),
    Row([4096] * 48, 32, 8), Row([4096] * 64, 32, 8), Row([131072] + [1024] * 63, 32, 8),
]  # fmt: skip
TARGET_VARIANTS = [("auto", "auto", 2), ("auto_t3", "auto", 3), ("plan", 0, 2), ("plan_t3", 0, 3)]


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    rows, variants = {"short": (SHORT_ROWS, SHORT_VARIANTS), "target": (TARGET_ROWS, TARGET_VARIANTS)}.get(
        mode, (ROWS, VARIANTS))  # fmt: skip
    log = ProbeLog(f"fp8-plan{'-' + mode if mode else ''}")
    l2 = _l2_bytes("cuda")
    threshold, target = plan.FP8_LONG_MIN_TOKENS, triton_splitk.PLANNER_SATURATION["fp8_long"]
    for row in rows:
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, 128, 16, torch.bfloat16, "cuda",
                              spare_pages=0)  # fmt: skip
        quantize_kv(c, "e4m3")
        ref, _ = reference_dense(c.q, c.k_cache.float() * FP8_K_SCALE, c.v_cache.float() * FP8_V_SCALE, *c.args[3:],
                                 device="cuda")  # fmt: skip
        copies = rotation_copies(c, l2)
        res, notes = {}, {}
        for name, thr, sat in variants:
            triton_splitk.PLANNER_SATURATION["fp8_long"] = sat
            launcher.clear()
            kw = dict(k_scale=FP8_K_SCALE, v_scale=FP8_V_SCALE)
            if thr != "auto":
                plan.FP8_LONG_MIN_TOKENS = thr
                p = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
                kw["plan"] = p
                notes[name] = f"S{p.num_splits}{'L' if p.long_tile else ''}"
            it = itertools.cycle(copies)

            def fn():
                x = next(it)
                return decode_attention(x.q, x.k_cache, x.v_cache, x.cache_seqlens, x.block_table, **kw)

            err = max_err(fn(), ref)
            assert err < 0.05, f"{row.name()} {name}: wrong, err {err}"
            res[name] = do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
        plan.FP8_LONG_MIN_TOKENS, triton_splitk.PLANNER_SATURATION["fp8_long"] = threshold, target
        line = f"{row.name():<22} " + "  ".join(f"{k} {v:6.1f}{'/' + notes[k] if k in notes else ''}"
                                                for k, v in res.items())  # fmt: skip
        log.row(dict(row=row.name() + " e4m3", **{k: round(v, 2) for k, v in res.items()}, splits=notes), line)
    log.close()


if __name__ == "__main__":
    main()
