"""What the device cut's arithmetic costs `auto`, in serving-sized block tables above all: each row's `auto` with
the cut counted in int64 (``triton_splitk.NARROW_CUT`` off: a 64-bit division on every program's path), in int32
where the shapes allow (on), and in int32 with the candidates sized from the row's longest sequence instead of the
table's capacity (``num_candidates``; what a bound read from the lengths would give, the same cut), with the plan and
FlashInfer in the same process. Rows in their own tables are controls (both columns run the same kernels: the run's noise). Each
backend is checked against the float64 reference before it is timed (CUDA-graph median, caches rotated out of L2).
Writes $OUT/table.jsonl, prints a table.

    python scripts/cand_probe.py
"""

from table_probe import report

from flashdecode import launcher, triton_splitk
from flashdecode.bench import SERVING_TABLE_TOKENS, Row, run_rows

SHAPES = [(1, 512, 12, 12), (4, 1024, 12, 12), (16, 1024, 12, 12), (16, 4096, 12, 12), (64, 1024, 12, 2),
          (16, 4096, 12, 2), (8, 2048, 28, 4), (1, 2048, 28, 4)]  # fmt: skip
CONTROLS = [(1, 512, 12, 12), (4, 1024, 12, 12), (16, 4096, 12, 12), (8, 2048, 28, 4), (4, 16384, 12, 12),
            (1, 65536, 12, 12), (1, 131072, 12, 12), (1, 65536, 12, 2), (1, 32768, 32, 32)]
# (column, NARROW_CUT, candidates from the longest sequence); each row runs them in this order, then the first again
VARIANTS = (("int64", False, False), ("int32", True, False), ("i32 fit", True, True))


def rows():
    big = [Row([s] * b, hq, hkv, table_tokens=SERVING_TABLE_TOKENS) for b, s, hq, hkv in SHAPES]
    return big + [Row([s] * b, hq, hkv) for b, s, hq, hkv in CONTROLS]


def main():
    table_sized = triton_splitk.num_candidates
    results = []
    for row in rows():
        longest = max(row.seqlens)
        for name, narrow, fit in VARIANTS + (("int64 again",) + VARIANTS[0][1:],):
            triton_splitk.NARROW_CUT = narrow
            triton_splitk.num_candidates = (
                lambda t, n, cap=longest: table_sized(min(t, cap), n)) if fit else table_sized
            launcher.clear()  # no launch replayed from the other variant's recording
            for rec in run_rows([row], ["auto"], "cuda", progress=False):
                rec["backend"] = name
                results.append(rec)
                print(name, row.name(), rec.get("graph_us") or rec.get("status"), flush=True)
    triton_splitk.num_candidates, triton_splitk.NARROW_CUT = table_sized, True
    results += run_rows(rows(), ["auto_plan", "flashinfer"], "cuda", progress=False)
    report(results, [name for name, _, _ in VARIANTS] + ["int64 again", "auto_plan", "flashinfer"])


if __name__ == "__main__":
    main()
