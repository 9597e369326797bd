"""Eager calls with and without the PDL chain (``triton_common.CHAIN_PDL``): for each row, with the plan, as the
benchmark calls it (rotated cache copies), the host time per queued call, the time of a call followed by a device
sync, triton's eager ``do_bench`` (an L2 flush before each call) three times and ``do_bench_cudagraph`` once, the
switch toggled twice in one process. Run on the GPU machine:

    python scripts/chain_eager_probe.py
"""

import itertools

import torch
from triton.testing import do_bench, do_bench_cudagraph

from flashdecode import decode_attention, launcher, plan_decode, triton_common
from flashdecode.bench import _l2_bytes, host_us_per_call, rotation_copies
from flashdecode.cases import random_paged_case

ROWS = [([128], 28, 4), ([2048], 28, 4), ([128] * 8, 28, 4), ([4096] * 16, 12, 2), ([8192] * 128, 32, 8)]


def main():
    for lens, hq, hkv in ROWS:
        case = random_paged_case(lens, hq, hkv, 128, 16, torch.bfloat16, "cuda", spare_pages=0, seed=0)
        copies = rotation_copies(case, _l2_bytes("cuda"))
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        cycle = itertools.cycle(copies)

        def call():
            return decode_attention(*next(cycle).args, plan=plan)

        name = f"{len(lens)}x{lens[0]} {hq}/{hkv}"
        for chain in (False, True, False, True):
            triton_common.CHAIN_PDL = chain
            launcher.clear()
            for _ in range(len(copies) + 2):
                call()
            host = host_us_per_call(call, 300)
            synced = host_us_per_call(call, 100, synced=True)
            eager = [do_bench(call, warmup=10, rep=50, return_mode="median") * 1e3 for _ in range(3)]
            graph = do_bench_cudagraph(call, rep=50, return_mode="median") * 1e3
            print(f"{name:>14} chain {chain!s:5}  host/call {host:6.1f} µs  synced call {synced:6.1f}  do_bench eager "
                  f"{' '.join(f'{e:6.1f}' for e in eager)}  graph {graph:6.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
