"""The first page ids before the lengths (``triton_common.EARLY_PAGES``) against after them, with the plan and
`auto`, in one process: each row runs off, on, off, on (the repeat shows the run's noise), every call checked against
the float64 reference before it is timed (CUDA-graph median, caches rotated out of L2). Writes $OUT/table.jsonl,
prints a table last.

    python scripts/early_probe.py

Rows: the anchor grid's single-pass and split rows of groups 4-16 (the prefetching tile, where the switch acts), a
few more uniform batches of those tiles, and controls (an MHA row and an uneven batch, which it does not touch).
"""

from table_probe import report

from flashdecode import launcher, triton_common
from flashdecode.bench import Row, run_rows

SHAPES = [(1, 128, 28, 4), (8, 128, 28, 4), (1, 2048, 28, 4), (8, 2048, 28, 4), (256, 256, 12, 2), (64, 1024, 12, 2),
          (16, 4096, 12, 2), (4, 16384, 12, 2), (1, 65536, 12, 2), (1, 131072, 12, 2), (32, 1024, 28, 4),
          (4, 512, 32, 8), (64, 4096, 32, 8), (1, 8192, 32, 32)]  # fmt: skip
UNEVEN = [Row([2048] + [64] * 7, 28, 4, label="8x64..2048 28/4")]


def main():
    rows = [Row([s] * b, hq, hkv) for b, s, hq, hkv in SHAPES] + UNEVEN
    default = triton_common.EARLY_PAGES
    results, names = [], []
    for row in rows:
        for run, early in enumerate((False, True, False, True)):
            triton_common.EARLY_PAGES = early
            launcher.clear()  # no launch replayed from the other variant's recording
            for rec in run_rows([row], ["auto_plan", "auto"], "cuda", progress=False):
                rec["backend"] = f"{rec['backend'][-4:]} {'on' if early else 'off'}{run // 2 + 1}"
                results.append(rec)
                names += [rec["backend"]] if rec["backend"] not in names else []
                print(rec["backend"], row.name(), rec.get("graph_us") or rec.get("status"), flush=True)
    triton_common.EARLY_PAGES = default
    report(results, names)


if __name__ == "__main__":
    main()
