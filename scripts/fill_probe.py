"""Fixed splits at the cut's count against counts that fill every resident program (S 33 for a cut of 32 on 12 KV
heads: 396 = 3 x 132 programs), on the rows where the device's cut leaves slots unused (graph µs, caches rotated out
of L2). Filling them was slower (docs/design.md, "What each optimisation bought"), so plans keep the cut's count.

Every variant is checked against the float64 reference. Run on the GPU machine, once per source tree to compare
(the split bounds are the kernel's, so an older tree gives the older bounds for the same S):

    PYTHONPATH=src python scripts/fill_probe.py > fill.log
"""

import itertools

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import plan_decode
from flashdecode.bench import probe_case
from flashdecode.check import max_err
from flashdecode.triton_splitk import decode_splitk

# (lengths, Hq, Hkv, split counts to time besides the plan's)
ROWS = [
    ([65536], 12, 12, (32, 33, 66)), ([131072], 12, 12, (32, 33, 66)), ([16384] * 4, 12, 2, (64, 66)),
    ([65536], 12, 2, (256, 264)), ([131072], 12, 2, (256, 264)), ([2048], 28, 4, (32, 64, 66, 132)),
    ([4096] * 16, 12, 2, (16,)), ([2048] * 8, 28, 4, (16,)), ([4096] * 16, 12, 12, (2,)),
]  # fmt: skip


def main():
    print(f"{'row':>16} {'S':>5} {'µs':>7}")
    for lens, hq, hkv, counts in ROWS:
        case, ref, rotated = probe_case(lens, hq, hkv)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        name = f"{len(lens)}x{lens[0]} {hq}/{hkv}"
        out = torch.empty_like(case.q)
        for s in sorted(set(counts)):
            cycle = itertools.cycle(rotated)

            def fn(c=None, s=s):
                c = c or next(cycle)
                return decode_splitk(*c.args, 128**-0.5, out, None, num_splits=s)[0]

            assert max_err(fn(case), ref) < 2e-2, (name, s)
            us = do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
            mark = " (plan)" if s == plan.num_splits else ""
            print(f"{name:>16} {s:>5} {us:7.1f}{mark}", flush=True)


if __name__ == "__main__":
    main()
