"""What ``plan_decode`` picks against every other launch it could have picked, on the rows where the plan still
trails a peer (graph µs, caches rotated out of L2): the single pass and fixed splits S = 2 .. 256 (up to ~8
programs per SM), beside ``auto`` and the plan. Run on the GPU machine:

    python scripts/splits_probe.py > splits.log         # the MHA, 32/32, head dim 256 and two GQA rows
    python scripts/splits_probe.py gqa 2 > splits.log   # the 12/2 and 28/4 rows, every variant timed twice
"""

import itertools
import sys

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import api, decode_attention, launcher, plan_decode
from flashdecode.bench import probe_case
from flashdecode.check import max_err

# (lengths, Hq, Hkv, head dim)
ROWS = [
    ([256] * 256, 12, 12, 128), ([1024] * 64, 12, 12, 128), ([4096] * 16, 12, 12, 128), ([16384] * 4, 12, 12, 128),
    ([65536], 12, 12, 128), ([131072], 12, 12, 128), ([8192], 32, 32, 128), ([32768], 32, 32, 128),
    ([131072], 32, 32, 128), ([2048] * 8, 28, 4, 128), ([1024] * 64, 12, 2, 128), ([4096] * 64, 32, 8, 256),
]  # fmt: skip
GQA_ROWS = [
    ([1024] * 64, 12, 2, 128), ([4096] * 16, 12, 2, 128), ([16384] * 4, 12, 2, 128), ([65536], 12, 2, 128),
    ([131072], 12, 2, 128), ([2048], 28, 4, 128), ([2048] * 8, 28, 4, 128), ([1024] * 24, 28, 4, 128),
]  # fmt: skip


def time_us(case, rotated, **kw):
    cycle = itertools.cycle(rotated)
    return do_bench_cudagraph(lambda: decode_attention(*next(cycle).args, **kw), rep=50, return_mode="median") * 1e3


def main():
    rows = GQA_ROWS if sys.argv[1:2] == ["gqa"] else ROWS
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    sms = api._num_sms(torch.device("cuda"))
    print(f"{'row':>22} {'variant':>14} {'µs':>7}")
    for lens, hq, hkv, d in rows:
        case, ref, rotated = probe_case(lens, hq, hkv, d)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        variants = [("auto", {}), (f"plan S={plan.num_splits}", {"plan": plan})]
        variants += [(f"S={s}", {"num_splits": s}) for s in (1, 2, 4, 8, 16, 32, 64, 128, 256)
                     if s == 1 or s * len(lens) * hkv <= 8 * sms]  # fmt: skip
        name = f"{len(lens)}x{lens[0]} {hq}/{hkv}" + ("" if d == 128 else f" D{d}")
        for label, kw in variants * repeats:
            launcher.clear()
            assert max_err(decode_attention(*case.args, **kw), ref) < 2e-2, (name, label)
            print(f"{name:>22} {label:>14} {time_us(case, rotated, **kw):7.1f}", flush=True)


if __name__ == "__main__":
    main()
