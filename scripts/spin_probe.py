"""Fixed splits merged by a combine that waits for the partial grid's end (PDL) against one whose programs spin on
the (sequence, KV head)'s arrival counter (``decode_splitk(spin=True)``), on the rows where ``plan_decode`` gives
fixed splits and a combine launch: the plan's split count and tile, each variant checked against the float64
reference before and after its timing and its counters checked to be zero again (graph µs, caches rotated out of L2,
the two variants alternated twice). Run on the GPU machine:

    python scripts/spin_probe.py
"""

import itertools

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import plan_decode
from flashdecode.bench import probe_case
from flashdecode.check import max_err
from flashdecode.triton_splitk import decode_splitk

ROWS = [([2048], 28, 4), ([16384] * 4, 12, 2), ([65536], 12, 2), ([131072], 12, 2), ([8192], 32, 32),
        ([4096] * 2, 12, 2), ([4096] * 8, 12, 2), ([2048] * 2, 28, 4), ([32768], 32, 32)]  # fmt: skip


def main():
    print(f"{'row':>16} {'S':>4} {'variant':>8} {'µs':>7}")
    for lens, hq, hkv in ROWS:
        name = f"{len(lens)}x{lens[0]} {hq}/{hkv}"
        case, ref, rotated = probe_case(lens, hq, hkv)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        if not plan.num_splits or plan.num_splits == 1 or plan.counters is not None:
            print(f"{name:>16} plan: {plan.reason}: skipped", flush=True)
            continue
        out = torch.empty_like(case.q)
        counters = torch.zeros(2 * len(lens) * hkv, dtype=torch.int32, device="cuda")
        for label, spin in itertools.islice(itertools.cycle([("combine", False), ("spin", True)]), 4):
            cycle = itertools.cycle(rotated)

            def fn(c=None, spin=spin):
                c = c or next(cycle)
                return decode_splitk(*c.args, 128**-0.5, out, None, num_splits=plan.num_splits, long_tile=plan.long_tile,
                                     len_hint=plan.len_hint, counters=counters if spin else None, spin=spin)[0]  # fmt: skip

            first = max_err(fn(case), ref)
            us = do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
            err = max_err(fn(case), ref)
            ok = first < 2e-2 and err < 2e-2 and int(counters.abs().sum()) == 0
            assert ok, (name, label, first, err, counters.nonzero())
            print(f"{name:>16} {plan.num_splits:>4} {label:>8} {us:7.1f}", flush=True)


if __name__ == "__main__":
    main()
