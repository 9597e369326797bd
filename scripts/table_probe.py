"""plan_decode's host table for uneven batches (plan.HOST_TABLE) against the device planner's cut it replaces, with
FlashInfer (tensor cores) in the same process: the bench's uneven and ragged presets, each backend checked against
the float64 reference before it is timed (CUDA-graph median, caches rotated out of L2). Writes $OUT/table.jsonl,
prints a table last.

    python scripts/table_probe.py              # the library's HOST_CHUNK_RATIO
    python scripts/table_probe.py 1.25 1.5     # the host cut with each of these candidate ratios
    python scripts/table_probe.py force        # the 12/2 and 28/4 uneven rows with chunks of fixed tile counts,
                                               # the merge fused (F) or launched (C), against the library's cut
"""

import json
import os
import sys

from flashdecode import launcher, plan, triton_splitk
from flashdecode.bench import PRESETS, add_metrics, measure_read_bandwidth, run_rows


def force():
    """Each chunk length (tiles of the split tile) forced on every sequence, with the merge in the last chunk
    program allowed for any count (F) or never (C); 'lib' is host_cut's own choice."""
    rows = [r for r in PRESETS["uneven"]() if r.num_q_heads in (12, 28) or len(r.seqlens) == 8]
    library = triton_splitk.host_cut
    variants = [("lib", None, triton_splitk.FUSED_EXPECTED_CHUNKS)]
    variants += [(f"T{t}{m}", t, n) for t in (4, 8, 12, 16, 24, 32, 48) for m, n in (("F", 1 << 20), ("C", 1))]
    results = []
    for name, tiles, fused in variants:
        triton_splitk.FUSED_EXPECTED_CHUNKS = fused
        launcher.clear()  # no launch recorded under another variant's constants
        triton_splitk.host_cut = library if tiles is None else (
            lambda visible, *a, t=tiles, **k: [max(1, -(-n // (32 * t))) for n in visible]
        )  # fmt: skip
        recs = run_rows(rows, ["auto_plan"], "cuda", progress=False)
        for rec in recs:
            rec["backend"] = name
        results += recs
        print(name, " ".join(f"{r.get('graph_us') or r.get('status')}" for r in recs), flush=True)
    triton_splitk.host_cut, triton_splitk.FUSED_EXPECTED_CHUNKS = library, variants[0][2]
    results += run_rows(rows, ["flashinfer_tc"], "cuda", progress=False)
    report(results, [v[0] for v in variants] + ["flashinfer_tc"])


def report(results, names):
    results = add_metrics(results, measure_read_bandwidth("cuda"))
    with open(os.path.join(os.environ.get("OUT", "."), "table.jsonl"), "w") as log:
        for rec in results:
            log.write(json.dumps(rec, default=str) + "\n")
    by_row = {}
    for rec in results:
        by_row.setdefault(rec["row"], {})[rec["backend"]] = rec
    print(f"{'row':<26}" + "".join(f"{n[:8]:>9}" for n in names))
    for row, recs in by_row.items():
        cells = []
        for n in names:
            r = recs.get(n, {})
            cells.append(f"{r['graph_us']:9.1f}" if r.get("graph_us") else f"{r.get('status', '-')[:8]:>9}")
        print(f"{row[:26]:<26}" + "".join(cells))


def main():
    if sys.argv[1:] == ["force"]:
        return force()
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
