"""How much of 8 x 2048 28/4 is the planned path's own cost when K/V sit in L2 (the condition of PERF.md's 14.1 µs,
reproduced by FlashInfer with tensor cores at 13.9 µs warm, 18.1 rotated: anchor-d14db47, warm-d14db47): `auto`
(planned in place + fused merge) against fixed splits of the same row, warm and rotated. Run on the GPU machine:

    python scripts/l2_probe.py
"""

import itertools

from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, launcher
from flashdecode.bench import probe_case
from flashdecode.check import max_err

ROWS = [([2048] * 8, 28, 4), ([2048], 28, 4), ([1024] * 64, 12, 2)]
VARIANTS = [("auto", {}), ("fixed S=4", {"num_splits": 4}), ("fixed S=8", {"num_splits": 8}),
            ("fixed S=16", {"num_splits": 16})]  # fmt: skip


def main():
    print(f"{'row':>14} {'variant':>11} {'warm µs':>8} {'rotated µs':>10}")
    for lens, hq, hkv in ROWS:
        case, ref, rotated = probe_case(lens, hq, hkv)
        for label, kw in VARIANTS:
            launcher.clear()
            assert max_err(decode_attention(*case.args, **kw), ref) < 2e-2, (lens, label)
            times = []
            for copies in ([case], rotated):
                cycle = itertools.cycle(copies)
                times.append(do_bench_cudagraph(lambda: decode_attention(*next(cycle).args, **kw), rep=50,
                                                return_mode="median") * 1e3)  # fmt: skip
            name = f"{len(lens)}x{lens[0]} {hq}/{hkv}"
            print(f"{name:>14} {label:>11} {times[0]:8.1f} {times[1]:10.1f}")


if __name__ == "__main__":
    main()
