"""Longest-first dispatch in the single pass (``triton_single.LONGEST_FIRST_MAX_BATCH``): `auto` with it and
without it (0) on the full-grid rows `auto` runs single-pass, uniform (what the order costs) and uneven (what it
buys), with the plan and FlashInfer (tensor cores) in the same process. Each backend is checked against the float64
reference before it is timed (CUDA-graph median, caches rotated out of L2). Writes $OUT/table.jsonl, prints a table.

    python scripts/order_probe.py [--quick]   # --quick: the first uniform and the first two uneven rows
"""

import random
import sys

from table_probe import report

from flashdecode import launcher, triton_single
from flashdecode.bench import Row, run_rows


def rows():
    g = random.Random(7)

    def uneven(batch, low, high, hq, hkv):
        return Row([g.randint(low, high) for _ in range(batch)], hq, hkv, label=f"{batch}x{low}..{high} {hq}/{hkv}")

    tail = [g.randint(256, 2048) for _ in range(120)] + [g.randint(16384, 32768) for _ in range(8)]
    g.shuffle(tail)
    return [
        Row([256] * 256, 12, 12), Row([1024] * 64, 12, 12), Row([2048] * 256, 32, 8), Row([2048] * 128, 32, 8),
        Row([512] * 512, 32, 8), Row([4096] * 256, 28, 4),
        uneven(128, 1024, 8192, 32, 8), uneven(256, 256, 4096, 32, 8), uneven(512, 500, 3000, 32, 8),
        uneven(160, 100, 16000, 32, 8), uneven(264, 1000, 8000, 28, 4), uneven(128, 1024, 8192, 12, 12),
        Row(tail, 32, 8, label="128 long tail 32/8"),
    ]  # fmt: skip


def main():
    chosen = rows()
    if "--quick" in sys.argv:
        chosen = chosen[:1] + chosen[6:8]
    results = []
    for name, limit in (("in order", 0), ("ordered", triton_single.LONGEST_FIRST_MAX_BATCH)):
        triton_single.LONGEST_FIRST_MAX_BATCH = limit
        launcher.clear()  # no launch replayed from the other variant's recording
        recs = run_rows(chosen, ["auto"], "cuda", progress=False)
        for rec in recs:
            rec["backend"] = name
        results += recs
        print(name, " ".join(f"{r.get('graph_us') or r.get('status')}" for r in recs), flush=True)
    results += run_rows(chosen, ["auto_plan", "flashinfer_tc"], "cuda", progress=False)
    report(results, ["in order", "ordered", "auto_plan", "flashinfer_tc"])


if __name__ == "__main__":
    main()
