"""Host time per eager decode_attention call on the GPU, with the cached launcher off and on (flashdecode/launcher.py),
and on with its replays calling Triton's launcher wrapper or the C function under it (``launcher.DIRECT``): wall
time of many queued calls on small cases (the GPU work is a few microseconds, so the host sets the pace), then a
cProfile of the replayed planned call. Run on the GPU machine:

    python scripts/host_overhead.py [--calls 500]
"""

import argparse
import cProfile
import pstats

import torch

from flashdecode import decode_attention, launcher
from flashdecode.bench import host_us_per_call
from flashdecode.cases import random_paged_case

# (label, lengths, Hq, Hkv): what "auto" runs on each is printed beside it
CASES = [
    ("8x128 28/4 (single pass)", [128] * 8, 28, 4),
    ("8x2048 28/4 (planned in place + combine)", [2048] * 8, 28, 4),
    ("64x1024 12/2 (planner + fused merge)", [1024] * 64, 12, 2),
    ("256x256 12/2 (dual path: single + planned)", [256] * 256, 12, 2),
    ("1x2048 28/4 (capacity splits + combine)", [2048], 28, 4),
    ("16x4096 12/2 (dual path: single + planned)", [4096] * 16, 12, 2),
]


# (cached launcher on, replays call the C launch function directly): the variants timed, in turn
VARIANTS = ((False, False), (True, False), (True, True))


def host_us(args, out, calls, cached, direct):
    """Mean host time per call over ``calls`` queued calls (no sync inside), after a warm-up."""
    if (launcher.ENABLED, launcher.DIRECT) != (cached, direct):
        launcher.clear()  # a new recording, made with this launch path
    launcher.ENABLED, launcher.DIRECT = cached, direct
    for _ in range(20):
        decode_attention(*args, out=out)
    return host_us_per_call(lambda: decode_attention(*args, out=out), calls)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    opts = parser.parse_args()
    print(f"{'case':44s} {'host code us':>13s} {'replayed us':>12s} {'direct us':>10s}  "
          f"(best of 5 rounds of {opts.calls} calls)")
    for label, lens, hq, hkv in CASES:
        c = random_paged_case(lens, hq, hkv, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
        out = torch.empty_like(c.q)
        ref = decode_attention(*c.args).clone()
        best = dict.fromkeys(VARIANTS, float("inf"))
        for _ in range(5):
            for variant in VARIANTS:
                best[variant] = min(best[variant], host_us(c.args, out, opts.calls, *variant))
                assert torch.equal(out, ref), f"{label} {variant}: the replayed call differs from the first"
        print(f"{label:44s} " + " ".join(f"{best[v]:{w}.1f}" for v, w in zip(VARIANTS, (13, 12, 10))), flush=True)
    launcher.ENABLED, launcher.DIRECT = True, True
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        decode_attention(*c.args, out=out)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
