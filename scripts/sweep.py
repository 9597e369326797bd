"""Launch-parameter sweep on the GPU: tiles, warps and stages for single-pass and planned split-K, and the
planner's programs per SM. One line per (row, config) is printed and appended to $OUT/sweep.jsonl as it runs;
the best per row comes last. Used to fill triton_common.launch_config and triton_splitk.PLANNER_SATURATION.
"""

import itertools
import json
import os

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import triton_splitk
from flashdecode.bench import Row, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense
from flashdecode.triton_single import decode_single

ROWS = [
    Row([1024] * 64, 12, 12), Row([4096] * 16, 12, 12), Row([65536], 12, 12), Row([65536], 12, 2),
    Row([1024] * 64, 12, 2), Row([131072], 32, 32), Row([2048] * 8, 28, 4), Row([2048], 28, 4),
    Row([4096] * 64, 32, 8), Row([256] * 256, 12, 12), Row([131072] + [1024] * 63, 32, 8), Row([3064] * 64, 32, 8),
    Row([128], 28, 4), Row([128] * 8, 28, 4),
]
TILES = [(64, 4, 3)]
# the planner's programs per SM for every tile (SATURATION_PER_SM, with the per-tile PLANNER_SATURATION off)
PLANS = [2, 4, 8]


def main():
    out_dir = os.environ.get("OUT", ".")
    log = open(os.path.join(out_dir, "sweep.jsonl"), "w")
    l2 = _l2_bytes("cuda")
    summary = []
    for row in ROWS:
        c = random_paged_case(
            row.seqlens, row.num_q_heads, row.num_kv_heads, 128, 16, torch.bfloat16, "cuda", spare_pages=0
        )
        ref, _ = reference_dense(*c.args, device="cuda")
        copies = rotation_copies(c, l2)
        best = None
        variants = [("single", None)] + [("planned", p) for p in PLANS]
        for (bn, warps, stages), (kind, ppsm) in itertools.product(TILES, variants):
            cfg = dict(BLOCK_N=bn, num_warps=warps, num_stages=stages)
            it = itertools.cycle(copies)
            if kind == "single":
                fn = lambda: decode_single(  # noqa: E731
                    *next(it).args, 128**-0.5, torch.empty_like(c.q), None, config=cfg
                )
            else:
                triton_splitk.PLANNER_SATURATION, triton_splitk.SATURATION_PER_SM = None, ppsm
                fn = lambda: triton_splitk.decode_splitk(  # noqa: E731
                    *next(it).args, 128**-0.5, torch.empty_like(c.q), None, config=cfg
                )
            try:
                err = max_err(fn()[0], ref)
                assert err < 0.05, f"wrong: err {err}"
                us = do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3
            except Exception as e:
                print(f"{row.name()} {kind} {ppsm} {cfg} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            gbps = round(row.io_bytes() / us / 1e3)
            rec = dict(row=row.name(), kind=kind, ppsm=ppsm, us=round(us, 2), gbps=gbps, **cfg)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            if best is None or us < best["us"]:
                best = rec
        summary.append(best)
        print("BEST", json.dumps(best), flush=True)
    print("\n".join(json.dumps(b) for b in summary))


if __name__ == "__main__":
    main()
