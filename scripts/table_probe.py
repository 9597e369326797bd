"""plan_decode's host table for uneven batches (plan.HOST_TABLE) against the device planner's cut it replaces, with
FlashInfer (tensor cores) in the same process: the bench's uneven and ragged presets, each backend checked against
the float64 reference before it is timed (CUDA-graph median, caches rotated out of L2). Writes $OUT/table.jsonl,
prints a table last.

    python scripts/table_probe.py              # the library's HOST_CHUNK_RATIO
    python scripts/table_probe.py 1.25 1.5     # the host cut with each of these candidate ratios
    python scripts/table_probe.py force "" T=32,F=99 F=12 [--all] [--e4m3]   # variants of the cut (force's
        # docstring) on the 8-sequence, 12/2 and 28/4 uneven rows (--all: every row; --e4m3: fp8 caches)
    python scripts/table_probe.py sorted       # `auto` and the plan on the uneven rows as drawn and sorted
"""

import dataclasses
import heapq
import itertools
import json
import os
import sys

from flashdecode import launcher, plan, triton_splitk
from flashdecode.bench import PRESETS, add_metrics, measure_read_bandwidth, run_rows


def simulate(sizes, num_sms, resident, cap, overhead):
    """Makespan (tokens at one SM's full rate) of programs of these lengths dispatched in order: the first `resident`
    per SM round robin, then each to the SM where one ends; an SM's programs share its rate, each at most 1 / cap."""
    queue, sms, heap, end = iter(sizes), [[0.0, []] for _ in range(num_sms)], [], 0.0
    for _ in range(resident):
        for sm in sms:
            sm[1] += [n + overhead for n in itertools.islice(queue, 1)]
    for j, sm in enumerate(sms):
        if sm[1]:
            heapq.heappush(heap, (min(sm[1]) * max(len(sm[1]), cap), j))
    while heap:
        t, j = heapq.heappop(heap)
        sm = sms[j]
        done = (t - sm[0]) / max(len(sm[1]), cap)
        sm[0], sm[1] = t, [n - done for n in sm[1] if n - done > 1e-6]
        sm[1] += [n + overhead for n in itertools.islice(queue, resident - len(sm[1]))]
        end = max(end, t)
        if sm[1]:
            heapq.heappush(heap, (t + min(sm[1]) * max(len(sm[1]), cap), j))
    return end


def sim_cut(cap, overhead):
    """host_cut with its candidates priced by `simulate` (programs in the table's order, heads inner)."""

    def cut(visible, programs_per_chunk, num_sms, saturation, block_n):
        best = None
        for cand in triton_splitk.host_candidates(max(triton_splitk.cdiv(n, block_n) for n in visible)):
            counts = [max(1, triton_splitk.cdiv(n, cand * block_n)) for n in visible]
            table = triton_splitk.host_table(visible, counts, block_n)
            chunks = len(table[0]) - len(visible)
            sizes = [min(e, visible[b]) - s for b, s, e in zip(table[0][:chunks], table[1], table[2])]
            order = [sizes[i] for i in table[3][:chunks] for _ in range(programs_per_chunk)]
            cost = simulate(order, num_sms, saturation, cap, overhead)
            if best is None or cost < best[0]:
                best = (cost, counts)
        return best[1]

    return cut


def force(specs, all_rows, kv_dtype=""):
    """Variants of the host cut, each a spec of comma-separated settings: T=<tiles> forces chunks of that many split
    tiles on every sequence (else host_cut's own choice), S=<cap>/<overhead> the cut whose candidate simulates
    fastest (sim_cut), O=seq the chunks in sequence order (not longest first), L=none
    no long fp8 tile, F=<n> the most chunks a sequence merged in the last chunk
    program (HOST_FUSED_MAX_CHUNKS), G=<gain> HOST_FINER_GAIN, R=<ratio> HOST_CHUNK_RATIO."""
    rows = PRESETS["uneven"]() + PRESETS["ragged"]()
    if not all_rows:
        rows = [r for r in rows[:-2] if r.num_q_heads in (12, 28) or len(r.seqlens) == 8]
    rows = [dataclasses.replace(r, kv_dtype=kv_dtype) for r in rows]
    names = ("host_cut", "host_table", "HOST_FUSED_MAX_CHUNKS", "HOST_FINER_GAIN", "HOST_CHUNK_RATIO")
    library = {n: getattr(triton_splitk, n) for n in names}
    long_min = plan.FP8_LONG_MIN_TOKENS
    results = []
    for spec in specs:
        kv = dict(item.split("=") for item in spec.split(",") if item)
        for n in names:
            setattr(triton_splitk, n, library[n])
        if "S" in kv:  # S=<cap>/<overhead tokens>: the simulated cut
            cap, overhead = (float(x) for x in kv["S"].split("/"))
            triton_splitk.host_cut = sim_cut(cap, overhead)
        if "T" in kv:
            tokens = 32 * int(kv["T"])  # the split tile of these rows is 32 tokens
            triton_splitk.host_cut = lambda visible, *a, t=tokens, **k: [max(1, -(-n // t)) for n in visible]
        if kv.get("O") == "seq":  # the table's chunks dispatched in sequence order, as the device planner's
            triton_splitk.host_table = lambda *a, t=library["host_table"]: t(*a)[:3] + [
                list(range(len(t(*a)[0]) - len(a[0]))) + [0] * len(a[0])
            ]  # fmt: skip
        # L=none: an fp8 cache's planned calls on the short fp8 tile (no FP8_LONG_MIN_TOKENS)
        plan.FP8_LONG_MIN_TOKENS = None if kv.get("L") == "none" else long_min
        triton_splitk.HOST_FUSED_MAX_CHUNKS = int(kv.get("F", library["HOST_FUSED_MAX_CHUNKS"]))
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
    plan.FP8_LONG_MIN_TOKENS = long_min
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


def sorted_batches():
    """`auto` (the device's planner or the single pass, both in sequence order) and the plan on each uneven row as
    drawn and with its sequences sorted longest first: what a longest-first order made on the device could give."""
    rows = []
    for r in PRESETS["uneven"]():
        rows += [r, dataclasses.replace(r, seqlens=sorted(r.seqlens, reverse=True), label="sorted " + r.name())]
    results = run_rows(rows, ["auto", "auto_plan"], "cuda", progress=False)
    report(results, ["auto", "auto_plan"])


def main():
    if sys.argv[1:] == ["sorted"]:
        return sorted_batches()
    if sys.argv[1:2] == ["force"]:
        specs = [a for a in sys.argv[2:] if not a.startswith("--")]
        return force(specs, "--all" in sys.argv, "e4m3" if "--e4m3" in sys.argv else "")
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
