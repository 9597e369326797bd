"""plan_decode's host table for uneven batches (plan.HOST_TABLE) against the device planner's cut it replaces, with
FlashInfer (tensor cores) in the same process: the bench's uneven and ragged presets, each backend checked against
the float64 reference before it is timed (CUDA-graph median, caches rotated out of L2). Writes $OUT/table.jsonl,
prints a table last.

    python scripts/table_probe.py              # the library's HOST_CHUNK_RATIO
    python scripts/table_probe.py 1.25 1.5     # the host cut with each of these candidate ratios
    python scripts/table_probe.py force "" T=32,F=99 F=12 [--all]   # variants of the cut (force's docstring) on
                                               # the 8-sequence, 12/2 and 28/4 uneven rows (--all: every row)
"""

import json
import os
import sys

from flashdecode import launcher, plan, triton_splitk
from flashdecode.bench import PRESETS, add_metrics, measure_read_bandwidth, run_rows


def force(specs, all_rows):
    """Variants of the host cut, each a spec of comma-separated settings: T=<tiles> forces chunks of that many split
    tiles on every sequence (else host_cut's own choice), F=<n> the most chunks a sequence merged in the last chunk
    program (FUSED_EXPECTED_CHUNKS), G=<gain> HOST_FINER_GAIN, R=<ratio> HOST_CHUNK_RATIO."""
    rows = PRESETS["uneven"]() + PRESETS["ragged"]()
    if not all_rows:
        rows = [r for r in rows[:-2] if r.num_q_heads in (12, 28) or len(r.seqlens) == 8]
    names = ("host_cut", "FUSED_EXPECTED_CHUNKS", "HOST_FINER_GAIN", "HOST_CHUNK_RATIO")
    library = {n: getattr(triton_splitk, n) for n in names}
    results = []
    for spec in specs:
        kv = dict(item.split("=") for item in spec.split(",") if item)
        for n in names:
            setattr(triton_splitk, n, library[n])
        if "T" in kv:
            tokens = 32 * int(kv["T"])  # the split tile of these rows is 32 tokens
            triton_splitk.host_cut = lambda visible, *a, t=tokens, **k: [max(1, -(-n // t)) for n in visible]
        triton_splitk.FUSED_EXPECTED_CHUNKS = int(kv.get("F", library["FUSED_EXPECTED_CHUNKS"]))
        triton_splitk.HOST_FINER_GAIN = float(kv.get("G", library["HOST_FINER_GAIN"]))
        triton_splitk.HOST_CHUNK_RATIO = float(kv.get("R", library["HOST_CHUNK_RATIO"]))
        launcher.clear()  # no launch recorded under another variant's constants
        recs = run_rows(rows, ["auto_plan"], "cuda", progress=False)
        for rec in recs:
            rec["backend"] = spec or "lib"
        results += recs
        print(spec or "lib", " ".join(f"{r.get('graph_us') or r.get('status')}" for r in recs), flush=True)
    for n in names:
        setattr(triton_splitk, n, library[n])
    results += run_rows(rows, ["flashinfer_tc"], "cuda", progress=False)
    report(results, [spec or "lib" for spec in specs] + ["flashinfer_tc"])


def report(results, names):
    results = add_metrics(results, measure_read_bandwidth("cuda"))
    with open(os.path.join(os.environ.get("OUT", "."), "table.jsonl"), "w") as log:
        for rec in results:
            log.write(json.dumps(rec, default=str) + "\n")
    by_row = {}
    for rec in results:
        by_row.setdefault(rec["row"], {})[rec["backend"]] = rec
    print(f"{'row':<26}" + "".join(f"{n[-8:]:>9}" for n in names))
    for row, recs in by_row.items():
        cells = []
        for n in names:
            r = recs.get(n, {})
            cells.append(f"{r['graph_us']:9.1f}" if r.get("graph_us") else f"{r.get('status', '-')[:8]:>9}")
        print(f"{row[:26]:<26}" + "".join(cells))


def main():
    if sys.argv[1:2] == ["force"]:
        return force([a for a in sys.argv[2:] if a != "--all"], "--all" in sys.argv)
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
    report(results, ["device_cut"] + [f"table_{ratio}" for ratio in ratios] + ["flashinfer_tc"])


if __name__ == "__main__":
    main()
