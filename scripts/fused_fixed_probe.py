"""Fixed splits with the merge in the last split program (``decode_splitk(counters=...)``) against fixed splits with
the combine launch, on the rows where ``plan_decode`` picks fixed splits (graph µs, caches rotated out of L2).

Each variant is checked against the float64 reference before and after its timing (the graph replays it hundreds of
times with the same counters, which the merging programs must leave at zero), and the counters are checked to be
zero. Run on the GPU machine:

    python scripts/fused_fixed_probe.py > fused_fixed.log
"""

import itertools

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import plan_decode
from flashdecode.bench import probe_case
from flashdecode.check import max_err
from flashdecode.triton_splitk import FUSED_MAX_CHUNKS, decode_splitk

# (lengths, Hq, Hkv)
ROWS = [
    ([2048] * 8, 28, 4), ([2048], 28, 4), ([1024] * 24, 28, 4), ([4096] * 16, 12, 2), ([16384] * 4, 12, 2),
    ([1024] * 64, 12, 2), ([16384] * 4, 12, 12), ([4096] * 16, 12, 12), ([65536], 12, 12), ([8192], 32, 32),
    ([32768], 32, 32), ([65536], 12, 2),
]  # fmt: skip


def main():
    print(f"{'row':>16} {'variant':>12} {'µs':>7}")
    for lens, hq, hkv in ROWS:
        case, ref, rotated = probe_case(lens, hq, hkv)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        name = f"{len(lens)}x{lens[0]} {hq}/{hkv}"
        if not plan.num_splits or plan.num_splits == 1:
            print(f"{name:>16} plan {plan.backend} S={plan.num_splits}: not fixed splits, skipped", flush=True)
            continue
        out = torch.empty_like(case.q)
        counters = torch.zeros(len(lens) * hq, dtype=torch.int32, device="cuda")
        splits = [s for s in (plan.num_splits // 2, plan.num_splits, plan.num_splits * 2) if 1 < s]
        variants = [(f"fixed S={s}", s, None) for s in splits]
        variants += [(f"fused S={s}", s, counters) for s in splits if s <= FUSED_MAX_CHUNKS]
        for label, s, ctr in variants:
            cycle = itertools.cycle(rotated)

            def fn(c=None, s=s, ctr=ctr):
                c = c or next(cycle)
                return decode_splitk(*c.args, 128**-0.5, out, None, num_splits=s, counters=ctr)[0]

            assert max_err(fn(case), ref) < 2e-2, (name, label)
            us = do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
            err = max_err(fn(case), ref)
            assert err < 2e-2 and int(counters.abs().sum()) == 0, (name, label, err, counters.nonzero())
            mark = " (plan)" if s == plan.num_splits and ctr is None else ""
            print(f"{name:>16} {label:>12} {us:7.1f}{mark}", flush=True)


if __name__ == "__main__":
    main()
