"""Why an eager call's time varies between runs on the small 28/4 rows (anchor-68863cb: 1 x 2048 33.8 µs eager
against 11.9 at 2378034, same code path): for each row, as the benchmark calls it (rotated cache copies, no out=),
the launcher's state for the call's key, the host time per queued call, and triton's eager do_bench a few times
in a row. Run on the GPU machine:

    python scripts/eager_probe.py
"""

import itertools

import torch
from triton.testing import do_bench

from flashdecode import decode_attention, launcher
from flashdecode.bench import _l2_bytes, host_us_per_call, rotation_copies
from flashdecode.cases import random_paged_case

ROWS = [([128], 28, 4), ([2048], 28, 4), ([128] * 8, 28, 4), ([2048] * 8, 28, 4), ([4096] * 64, 32, 8)]


def main():
    for lens, hq, hkv in ROWS:
        case = random_paged_case(lens, hq, hkv, 128, 16, torch.bfloat16, "cuda", spare_pages=0, seed=0)
        copies = rotation_copies(case, _l2_bytes("cuda"))
        cycle = itertools.cycle(copies)
        launcher.clear()
        for _ in range(len(copies) + 2):
            decode_attention(*next(cycle).args)
        torch.cuda.synchronize()
        states = {("uncacheable" if v is launcher.UNCACHEABLE else type(v).__name__) for v in launcher._cache.values()}
        host = host_us_per_call(lambda: decode_attention(*next(cycle).args), 500)
        synced = host_us_per_call(lambda: decode_attention(*next(cycle).args), 200, synced=True)
        eager = [do_bench(lambda: decode_attention(*next(cycle).args), warmup=10, rep=50, return_mode="median") * 1e3
                 for _ in range(4)]  # fmt: skip
        name = f"{len(lens)}x{lens[0]} {hq}/{hkv}"
        print(f"{name:>14}  copies {len(copies):2d}  launcher {sorted(states)}  host/call {host:6.1f} µs  "
              f"synced call {synced:6.1f} µs  do_bench eager {' '.join(f'{e:6.1f}' for e in eager)} µs")  # fmt: skip


if __name__ == "__main__":
    main()
