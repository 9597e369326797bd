"""plan_decode's single-pass rule (plan.SINGLE_FULL_*) on rows outside the sweep it came from: each row planned with
the rule and without it (SINGLE_FULL_MAX_TOKENS = 0), both plans timed in one process (graph µs, caches rotated out
of L2), each checked against the float64 reference first. Run on the GPU machine:

    python scripts/single_full_probe.py > single_full.log
"""

import itertools

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, plan, plan_decode
from flashdecode.bench import probe_case
from flashdecode.check import max_err

# (lengths, Hq, Hkv): programs a SM on 132 SMs in the comment
ROWS = [
    ([1024] * 66, 12, 2),  # 1.00
    ([800] * 64, 12, 2),  # 0.97
    ([1024] * 33, 28, 4),  # 1.00
    ([768] * 16, 32, 8),  # 0.97
    ([700] * 128, 12, 2),  # 1.94
    ([900] * 32, 32, 8),  # 1.94
    ([1024] * 62, 12, 2),  # 0.94: below the rule's fill
    ([1536] * 64, 12, 2),  # 0.97, longer than the rule's 1024 tokens
    ([1024] * 64, 12, 2),  # 0.97: the anchor row
]


def main():
    print(f"{'row':>16} {'rule':>22} {'µs':>6} {'without':>22} {'µs':>6}")
    for lens, hq, hkv in ROWS:
        case, ref, rotated = probe_case(lens, hq, hkv)
        with_rule = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        saved, plan.SINGLE_FULL_MAX_TOKENS = plan.SINGLE_FULL_MAX_TOKENS, 0
        without = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        plan.SINGLE_FULL_MAX_TOKENS = saved
        times = []
        for p in (with_rule, without):
            cycle = itertools.cycle(rotated)
            out = torch.empty_like(case.q)

            def fn(c=None, p=p):
                return decode_attention(*(c or next(cycle)).args, plan=p, out=out)

            err = max_err(fn(case), ref)
            assert err < 2e-2, (lens[0], hq, hkv, p.reason, err)
            times.append(do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3)
        name = f"{len(lens)}x{lens[0]} {hq}/{hkv}"
        label = [f"{p.backend} S={p.num_splits}" for p in (with_rule, without)]
        print(f"{name:>16} {label[0]:>22} {times[0]:6.1f} {label[1]:>22} {times[1]:6.1f}", flush=True)


if __name__ == "__main__":
    main()
