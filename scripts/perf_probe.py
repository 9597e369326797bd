"""Split-K overhead probe on the GPU: where the time of the planned path goes, and what PDL, a wider combine
grid and the partial kernel's tile choice buy. Writes $OUT/probe.jsonl (one line per row x variant) and
$OUT/profile.txt (per-kernel GPU time from torch.profiler); prints the best variant per row last.

    python scripts/perf_probe.py            # all rows
"""

import itertools
import json
import os

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import triton_common, triton_splitk
from flashdecode.bench import Row, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense

ROWS = [
    Row([65536], 12, 2), Row([1024] * 64, 12, 2), Row([4096] * 16, 12, 2), Row([131072], 12, 2),
    Row([2048] * 8, 28, 4), Row([2048], 28, 4),
    Row([65536], 12, 12), Row([4096] * 16, 12, 12), Row([16384] * 4, 12, 12),
    Row([8192], 32, 32), Row([32768], 32, 32), Row([131072], 32, 32),
]
# (PDL, combine D blocks, partial tile override)
VARIANTS = list(itertools.product([False, True], [1, 4], [None, dict(BLOCK_N=64, num_stages=3)]))


def profile_row(row, fn, log):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    log.write(f"== {row.name()} (20 calls)\n")
    log.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8) + "\n")
    log.flush()


def main():
    out_dir = os.environ.get("OUT", ".")
    log = open(os.path.join(out_dir, "probe.jsonl"), "w")
    prof_log = open(os.path.join(out_dir, "profile.txt"), "w")
    l2 = _l2_bytes("cuda")
    best_rows = []
    for row in ROWS:
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
        ref, _ = reference_dense(*c.args, device="cuda")
        copies = rotation_copies(c, l2)
        results = []
        for pdl, dblocks, tile in VARIANTS:
            triton_common.PDL = pdl
            triton_splitk.COMBINE_D_BLOCKS = dblocks
            it = itertools.cycle(copies)
            out = torch.empty_like(c.q)

            def fn():
                return triton_splitk.decode_splitk(*next(it).args, 128**-0.5, out, None, config=tile)

            try:
                err = max_err(fn()[0], ref)
                assert err < 0.05, f"wrong: err {err}"
                us = do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
            except Exception as e:  # noqa: BLE001 - a failing variant is reported, the sweep goes on
                print(f"{row.name()} pdl={pdl} d={dblocks} tile={tile} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            rec = dict(row=row.name(), pdl=pdl, combine_d_blocks=dblocks, tile=tile, us=round(us, 2),
                       gbps=round(row.io_bytes() / us / 1e3))  # fmt: skip
            log.write(json.dumps(rec) + "\n")
            log.flush()
            results.append(rec)
            if (pdl, dblocks, tile) == (False, 1, None):
                profile_row(row, fn, prof_log)
        base = next((r for r in results if (r["pdl"], r["combine_d_blocks"], r["tile"]) == (False, 1, None)), None)
        best = min(results, key=lambda r: r["us"]) if results else None
        best_rows.append((row.name(), base, best))
        print(row.name(), "base", base and base["us"], "best", best, flush=True)
    triton_common.PDL, triton_splitk.COMBINE_D_BLOCKS = True, 1
    print(f"\n{'row':<22}{'base us':>9}{'best us':>9}  best variant")
    for name, base, best in best_rows:
        if base and best:
            print(f"{name:<22}{base['us']:>9.1f}{best['us']:>9.1f}  pdl={best['pdl']} d={best['combine_d_blocks']} tile={best['tile']}")


if __name__ == "__main__":
    main()
