"""Partial and combine kernel durations of small fixed-split rows, one kernel at a time, for Nsight Compute:

    ncu --kernel-name regex:"_partial_kernel|_combine_kernel" --metrics gpu__time_duration.sum --cache-control none \\
        --csv python scripts/ncu_small_splits.py > ncu.csv
    python scripts/ncu_small_splits.py --parse ncu.csv

The question: the rows 1 x 4096 12/2 and 2 x 2048 12/2 run the same partial programs (256 of 32 tokens at S, 128 of
64 at S/2) yet S/2 is slower on the first and faster on the second (docs/design.md, "Bytes in flight"). Which
kernel differs? Each configuration runs CALLS times; ncu serializes the kernels, so the combine's wait is free.
"""

import csv
import io
import sys

ROWS = [(1, 4096, 12, 2), (2, 2048, 12, 2), (1, 2048, 28, 4), (1, 2048, 12, 2)]
SPLITS = (32, 64, 128)
CALLS = 3


def configs():
    for b, s, hq, hkv in ROWS:
        for splits in SPLITS:
            if s // splits >= 16:
                yield (b, s, hq, hkv), splits


def run():
    import torch

    from flashdecode import triton_splitk
    from flashdecode.cases import random_paged_case

    for (b, s, hq, hkv), splits in configs():
        c = random_paged_case([s] * b, hq, hkv, 128, 16, torch.bfloat16, "cuda")
        out = torch.empty_like(c.q)
        for _ in range(CALLS):
            triton_splitk.decode_splitk(*c.args, 128**-0.5, out, None, num_splits=splits)
        torch.cuda.synchronize()


def parse(path):
    text = open(path).read()
    rows = list(csv.reader(io.StringIO(text[text.index('"ID"'):])))
    head, body = rows[0], rows[1:]
    name, value = head.index("Kernel Name"), head.index("Metric Value")
    times = [(r[name], float(r[value].replace(",", ""))) for r in body if len(r) > value]
    print(f"{'row':>14} {'S':>4} {'partial µs':>11} {'combine µs':>11}  (median of the calls, ncu: one kernel at a time)")
    i = 0
    for (b, s, hq, hkv), splits in configs():
        part = sorted(t for n, t in times[i : i + 2 * CALLS] if "partial" in n)
        comb = sorted(t for n, t in times[i : i + 2 * CALLS] if "combine" in n)
        i += 2 * CALLS
        print(f"{b}x{s} {hq}/{hkv}".rjust(14), f"{splits:4d} {part[len(part) // 2] / 1e3:11.2f} {comb[len(comb) // 2] / 1e3:11.2f}")


if __name__ == "__main__":
    parse(sys.argv[2]) if sys.argv[1:2] == ["--parse"] else run()
