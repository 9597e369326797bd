"""GPU check of the launch table's new rows (large GQA groups, multi-token queries, head_dim 256): 4 vs 8 warps,
single pass and planned split-K. One line per (row, config); the output is checked against the float64 reference
before timing. Run: .venv/bin/python scripts/feat_configs.py (about a minute on the H200)."""

import itertools
import math

import torch
from triton.testing import do_bench_cudagraph

from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense
from flashdecode.triton_common import Features, launch_config
from flashdecode.triton_single import decode_single
from flashdecode.triton_splitk import decode_splitk

# (batch, seqlen, Hq, Hkv, head_dim, q_len)
ROWS = [
    (64, 4096, 32, 8, 128, 1),  # control: a measured default configuration
    (16, 4096, 64, 1, 128, 1),
    (16, 4096, 128, 1, 64, 1),
    (16, 4096, 32, 1, 256, 1),
    (16, 4096, 16, 1, 128, 8),
]


def main():
    print(f"{'row':34} {'kind':8} {'warps':>5} {'BLOCK_H':>7} {'us':>8} {'GB/s':>6} {'max err':>8}")
    for batch, seqlen, hq, hkv, d, q_len in ROWS:
        c = random_paged_case([seqlen] * batch, hq, hkv, d, 16, torch.bfloat16, "cuda", spare_pages=0)
        q = c.q if q_len == 1 else torch.randn(batch, q_len, hq, d, device="cuda").to(torch.bfloat16)
        args = (q,) + c.args[1:]
        ref, _ = reference_dense(*args, device="cuda")
        scale, features = d**-0.5, Features(q_len=q_len)
        cfg = launch_config(d, hq // hkv, torch.bfloat16, q_len)
        blocks = math.ceil(q_len * hq // hkv / cfg["BLOCK_H"])
        nbytes = 2 * batch * seqlen * hkv * d * 2 * blocks
        name = f"{batch}x{seqlen} {hq}/{hkv} D{d} T{q_len} ({blocks} blk)"
        for kind, warps in itertools.product(("single", "planned"), (4, 8)):
            over = dict(num_warps=warps)
            launch = decode_single if kind == "single" else decode_splitk

            def fn(launch=launch, over=over):
                return launch(*args, scale, torch.empty_like(q), None, config=over, features=features)

            try:
                err = max_err(fn()[0], ref)
                us = do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
                print(f"{name:34} {kind:8} {warps:5} {cfg['BLOCK_H']:7} {us:8.1f} {nbytes / us / 1e3:6.0f} {err:8.2g}"
                      f"{'  (default)' if warps == cfg['num_warps'] else ''}", flush=True)  # fmt: skip
            except Exception as e:
                print(f"{name:34} {kind:8} {warps:5} FAILED {type(e).__name__}: {str(e)[:150]}", flush=True)


if __name__ == "__main__":
    main()
