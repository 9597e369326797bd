"""`auto` under variants of the library's switches, each row running every variant back to back (then the first
again: the run's noise), with the plan and FlashInfer in the same process. Each backend is checked against the
float64 reference before it is timed (CUDA-graph median, caches rotated out of L2). Writes $OUT/table.jsonl, prints
a table.

    python scripts/variant_probe.py [cut]

cut: the device cut counted in int64 (``triton_splitk.NARROW_CUT`` off: a 64-bit division on every program's
path), in int32 where the shapes allow (on), and in int32 with the candidates sized from the row's longest sequence
instead of the table's capacity (``num_candidates``; what a bound read from the lengths would give, the same cut).
Rows in serving-sized tables (T131072) and in their own. (At a16535e a set "mhaslots" measured the MHA tiles'
grid with 4 or 3 slot programs per SM instead of 8: docs/design.md, not kept.)
"""

import sys

from table_probe import report

from flashdecode import launcher, triton_splitk
from flashdecode.bench import SERVING_TABLE_TOKENS, Row, run_rows

SHAPES = [(1, 512, 12, 12), (4, 1024, 12, 12), (16, 1024, 12, 12), (16, 4096, 12, 12), (64, 1024, 12, 2),
          (16, 4096, 12, 2), (8, 2048, 28, 4), (1, 2048, 28, 4)]  # fmt: skip
CONTROLS = [(1, 512, 12, 12), (4, 1024, 12, 12), (16, 4096, 12, 12), (8, 2048, 28, 4), (4, 16384, 12, 12),
            (1, 65536, 12, 12), (1, 131072, 12, 12), (1, 65536, 12, 2), (1, 32768, 32, 32)]

# {set: (rows, [(column, {constant: value}, candidates from the longest sequence)])}
VARIANTS = {
    "cut": ((SHAPES, CONTROLS), [("int64", dict(NARROW_CUT=False), False), ("int32", dict(NARROW_CUT=True), False),
                                 ("i32 fit", dict(NARROW_CUT=True), True)]),
}  # fmt: skip


def rows(shapes, controls):
    big = [Row([s] * b, hq, hkv, table_tokens=SERVING_TABLE_TOKENS) for b, s, hq, hkv in shapes]
    uneven = [Row([100, 7000, 300, 2500, 40, 1200, 900, 5000], 12, 12, label="8x40..7000 12/12")]
    return big + [Row([s] * b, hq, hkv) for b, s, hq, hkv in controls] + uneven


def main():
    (shapes, controls), columns = VARIANTS[sys.argv[1] if len(sys.argv) > 1 else "cut"]
    defaults = {k: getattr(triton_splitk, k) for _, settings, _ in columns for k in settings}
    table_sized = triton_splitk.num_candidates
    results = []
    for row in rows(shapes, controls):
        longest = max(row.seqlens)
        for name, settings, fit in columns + [(columns[0][0] + " again",) + columns[0][1:]]:
            for constant, value in settings.items():
                setattr(triton_splitk, constant, value)
            triton_splitk.num_candidates = (
                lambda t, n, cap=longest: table_sized(min(t, cap), n)) if fit else table_sized
            launcher.clear()  # no launch replayed from the other variant's recording
            for rec in run_rows([row], ["auto"], "cuda", progress=False):
                rec["backend"] = name
                results.append(rec)
                print(name, row.name(), rec.get("graph_us") or rec.get("status"), flush=True)
    triton_splitk.num_candidates = table_sized
    for constant, value in defaults.items():
        setattr(triton_splitk, constant, value)
    results += run_rows(rows(shapes, controls), ["auto_plan", "flashinfer"], "cuda", progress=False)
    report(results, [c[0] for c in columns] + [columns[0][0] + " again", "auto_plan", "flashinfer"])


if __name__ == "__main__":
    main()
