"""plan_decode's host table for uneven batches (plan.HOST_TABLE) against the device planner's cut it replaces, with
FlashInfer (tensor cores) in the same process: the bench's uneven and ragged presets, each backend checked against
the float64 reference before it is timed (CUDA-graph median, caches rotated out of L2). Writes $OUT/table.jsonl,
prints a table last.

    python scripts/table_probe.py              # the library's HOST_CHUNK_RATIO
    python scripts/table_probe.py 1.25 1.5     # the host cut with each of these candidate ratios
"""

import json
import os
import sys

from flashdecode import plan, triton_splitk
from flashdecode.bench import PRESETS, add_metrics, measure_read_bandwidth, run_rows


def main():
    rows = PRESETS["uneven"]() + PRESETS["ragged"]()
    ratios = [float(a) for a in sys.argv[1:]] or [triton_splitk.HOST_CHUNK_RATIO]
    plan.HOST_TABLE = False
    results = run_rows(rows, ["auto_plan"], "cuda", progress=False)
    for rec in results:
        rec["backend"] = "device_cut"
    plan.HOST_TABLE = True
    for ratio in ratios:
        triton_splitk.HOST_CHUNK_RATIO = ratio
        recs = run_rows(rows, ["auto_plan"], "cuda", progress=False)
        for rec in recs:
            rec["backend"] = f"table_{ratio}"
        results += recs
    results += run_rows(rows, ["flashinfer_tc"], "cuda", progress=False)
    results = add_metrics(results, measure_read_bandwidth("cuda"))
    with open(os.path.join(os.environ.get("OUT", "."), "table.jsonl"), "w") as log:
        for rec in results:
            log.write(json.dumps(rec, default=str) + "\n")
    names = ["device_cut"] + [f"table_{ratio}" for ratio in ratios] + ["flashinfer_tc"]
    by_row = {}
    for rec in results:
        by_row.setdefault(rec["row"], {})[rec["backend"]] = rec
    print(f"{'row':<42}" + "".join(f"{n:>14}" for n in names))
    for row, recs in by_row.items():
        cells = []
        for n in names:
            r = recs.get(n, {})
            cells.append(f"{r['graph_us']:14.1f}" if r.get("graph_us") else f"{r.get('status', '-'):>14}")
        print(f"{row[:42]:<42}" + "".join(cells))


if __name__ == "__main__":
    main()
