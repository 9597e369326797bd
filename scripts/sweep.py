"""Launch-parameter sweep on the GPU: tile size, warps, stages, dot vs CUDA-core products, splits per SM.

Prints, per row, the time of every configuration and the best one; the full table goes to $OUT/sweep.json.
Used to fill the table in triton_single.launch_config and PROGRAMS_PER_SM (docs/design.md records the outcome).
"""

import itertools
import json
import os
import sys

import torch

from flashdecode.bench import Row, rotation_copies, _l2_bytes
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense
from flashdecode.triton_single import decode_single, launch_config
from flashdecode.triton_splitk import decode_splitk, plan_num_splits
from triton.testing import do_bench_cudagraph

ROWS = [
    Row([1024] * 64, 12, 12), Row([4096] * 16, 12, 12), Row([65536], 12, 12), Row([65536], 12, 2),
    Row([1024] * 64, 12, 2), Row([131072], 32, 32), Row([2048] * 8, 28, 4), Row([2048], 28, 4),
    Row([4096] * 64, 32, 8), Row([256] * 256, 12, 12),
]
TILES = [(64, 4, 2), (64, 4, 3), (64, 4, 4), (32, 4, 3), (32, 4, 4), (128, 4, 2), (128, 8, 3), (64, 8, 3)]
PPSM = [1, 2, 4, 8, 16]


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    l2 = _l2_bytes("cuda")
    records = []
    for row in ROWS:
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
        ref, _ = reference_dense(*c.args, device="cuda")
        copies = rotation_copies(c, l2)
        group = row.num_q_heads // row.num_kv_heads
        dots = [True, False] if group < 8 else [True]
        splits = sorted({plan_num_splits(row.batch, row.num_kv_heads, max(row.seqlens), 64, sms, p) for p in PPSM})
        best = None
        for (bn, warps, stages), use_dot, s in itertools.product(TILES, dots, splits):
            cfg = dict(BLOCK_N=bn, num_warps=warps, num_stages=stages, USE_DOT=use_dot)
            cfg["BLOCK_H"] = max(16, 1 << (group - 1).bit_length()) if use_dot else 1 << (group - 1).bit_length()
            it = itertools.cycle(copies)
            scale = 128**-0.5
            if s == 1:
                fn = lambda: decode_single(*next(it).args, scale, torch.empty_like(c.q), None, config=cfg)
            else:
                fn = lambda: decode_splitk(*next(it).args, scale, torch.empty_like(c.q), None, num_splits=s, config=cfg)
            try:
                out = fn()[0]
                err = max_err(out, ref)
                if err > 0.05:
                    raise RuntimeError(f"wrong: err {err}")
                us = do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3
            except Exception as e:
                print(row.name(), cfg, s, "FAILED", type(e).__name__, str(e)[:100], file=sys.stderr)
                continue
            rec = dict(row=row.name(), splits=s, us=us, gbps=row.io_bytes() / us / 1e3, **cfg)
            records.append(rec)
            if best is None or us < best["us"]:
                best = rec
        default = launch_config(128, group, torch.bfloat16)
        print(f"{row.name():<20} best {best['us']:8.1f} us {best['gbps']:6.0f} GB/s  S={best['splits']:<4} "
              f"BN={best['BLOCK_N']} w={best['num_warps']} st={best['num_stages']} dot={best['USE_DOT']}", flush=True)
    os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
    with open(os.path.join(os.environ.get("OUT", "."), "sweep.json"), "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
