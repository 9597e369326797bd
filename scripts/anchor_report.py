"""Anchor-grid report: flashdecode ``auto`` against the fastest peer of the same run (FlashInfer's two paths, and
SGLang's and vLLM's Triton kernels where the run had them) and against the best peer time in ../shared/PERF.md,
optionally before / after against an earlier results.json. Prints a markdown table, the geometric means and the
rows more than 5% slower than before; then the same for the eager column (host time included: what a caller
without CUDA graphs sees); then, given a ``--warm-l2`` run, its rows against PERF.md and the anchor geomean with
each row timed as PERF.md timed it (its rows under the 60 MB L2 warm, the others rotated: ``perf_conditions``);
then, with ``--floor``, each
anchor row against an ideal kernel's time (the row's bytes at a read ceiling plus a fixed cost per call).

    python scripts/anchor_report.py NEW/results.json [OLD/results.json] [--warm WARM/results.json] [--ours auto_plan]
        [--floor GBPS,US]

``--ours`` reports another of our backends in place of ``auto`` (``auto_plan``: planned once per case on the host,
as FlashInfer is); the "before" column is the old run's same backend (it was the old ``auto`` until 69cd4c9: the
reports of anchor-1ab8212 and earlier show that).
"""

import json
import math
import sys

sys.path.insert(0, "src")
from flashdecode.bench import FLASHDECODE_BACKENDS, PLANNED, compare, read_bandwidths  # noqa: E402

# ../shared/PERF.md (H200, 2026-11-22): the best time any peer reached on each anchor row, graph µs
PERF_PEER_US = {
    "256x256 12/12": 98.9, "64x1024 12/12": 96.8, "16x4096 12/12": 100.3, "4x16384 12/12": 99.4,
    "1x65536 12/12": 101.0, "1x131072 12/12": 189.5, "256x256 12/2": 25.1, "64x1024 12/2": 27.2,
    "16x4096 12/2": 26.8, "4x16384 12/2": 26.5, "1x65536 12/2": 28.2, "1x131072 12/2": 44.4,
    "1x8192 32/32": 39.7, "1x32768 32/32": 129.7, "1x131072 32/32": 489.0, "1x128 28/4": 5.0, "1x2048 28/4": 8.2,
    "8x128 28/4": 5.6, "8x2048 28/4": 14.1, "64x4096 32/8": 252.0, "256x2048 32/8": 504.5, "128x8192 32/8": 978.8,
    # more rows of PERF.md (32/8 unless named)
    "ragged 1x131072+63x1024 32/8": 355.8, "uniform 64x3064 32/8 (same bytes)": 190.4,
    "64x4096 32/8 D64 P16 bf16": 140.1, "64x4096 32/8 D256 P16 bf16": 494.6,
}  # fmt: skip
# the anchor grid: PERF.md's first 22 rows
ANCHOR_ROWS = list(PERF_PEER_US)[:22]


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data["meta"], data["results"]


# backends of flashdecode itself: every other backend in a results file is a peer
OWN = FLASHDECODE_BACKENDS + (PLANNED, "reference")
SHORT = {"flashinfer": "FI", "flashinfer_tc": "FI TC", "sglang_triton": "SGLang", "vllm_triton": "vLLM",
         "flash_attn": "FA", "torch_compile": "compile", "flex_attention": "flex"}  # fmt: skip


def best_peer(entry):
    """(µs, short name) of the fastest peer in a row's {backend: µs}, or (None, "")."""
    peers = [(us, SHORT.get(b, b)) for b, us in entry.items() if b not in OWN + ("kv_mb", "gbps")]
    return min(peers) if peers else (None, "")


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


# the backend reported (``--ours``)
OURS = "auto"


def pop_option(args, flag, default=None):
    """(value, the other args) of ``flag VALUE`` in args, or (default, args)."""
    if flag not in args:
        return default, args
    i = args.index(flag)
    return args[i + 1], args[:i] + args[i + 2 :]


def main():
    global OURS
    args = sys.argv[1:]
    OURS, args = pop_option(args, "--ours", OURS)
    warm, args = pop_option(args, "--warm")
    floor, args = pop_option(args, "--floor")
    meta, results = load(args[0])
    old = {}
    if len(args) > 1:
        old_meta, old_results = load(args[1])
        old = {r["row"]: r["graph_us"] for r in old_results if r["backend"] == OURS and r.get("graph_us")}
    rows = {}
    for r in results:
        entry = rows.setdefault(r["row"], {"kv_mb": r["kv_bytes"] / 1e6})
        if r.get("graph_us") and r["status"] == "ok":
            entry[r["backend"]] = r["graph_us"]
            if r["backend"] == OURS:
                entry["gbps"] = r["gbps"]
    before = f"{old_meta['commit']} µs" if old else "before µs"
    print(f"graph µs, {meta['gpu']}, commit {meta['commit']}, torch {meta['torch']}, triton {meta['triton']}, "
          f"flashinfer {meta.get('flashinfer')}; {read_bandwidths(meta)}\n")  # fmt: skip
    print(f"| row | K+V MB | {before} | {OURS} µs | GB/s | best peer, same run µs | PERF.md peer µs | vs same run "
          "| vs PERF.md |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    vs_fi, vs_peer, anchor_fi, anchor_peer = [], [], [], []
    for name, e in rows.items():
        if OURS not in e:
            continue
        fi, who = best_peer(e)
        peer = PERF_PEER_US.get(name)
        s_fi, s_peer = (fi / e[OURS] if fi else None), (peer / e[OURS] if peer else None)
        anchor = name in ANCHOR_ROWS
        if s_fi:
            vs_fi.append(s_fi)
            anchor_fi += [s_fi] if anchor else []
        if s_peer:
            vs_peer.append(s_peer)
            anchor_peer += [s_peer] if anchor else []
        cells = [f"{old[name]:.1f}" if name in old else "", f"{e[OURS]:.1f}", f"{e['gbps']:.0f}",
                 f"{fi:.1f} ({who})" if fi else "", f"{peer:.1f}" if peer else "", f"{s_fi:.2f}×" if s_fi else "",
                 f"{s_peer:.2f}×" if s_peer else ""]  # fmt: skip
        print(f"| {name} | {e['kv_mb']:.1f} | " + " | ".join(cells) + " |")
    at_least = sum(1 for s in anchor_peer if s >= 1.0)
    at_least_run = sum(1 for s in anchor_fi if s >= 1.0)
    same_run = (f"{geomean(anchor_fi):.3f}× the fastest peer of the same run ({at_least_run} of {len(anchor_fi)} rows "
                f"at least as fast)" if anchor_fi else "no peer timed in this run")
    print(f"\nAnchor grid ({len(anchor_peer)} rows): geomean speed {same_run}, {geomean(anchor_peer):.3f}× "
          f"PERF.md's best peer ({at_least} of {len(anchor_peer)} rows at least as fast). All rows: "
          + (f"{geomean(vs_fi):.3f}× same run, " if vs_fi else "") + f"{geomean(vs_peer):.3f}× PERF.md.")  # fmt: skip
    if old:
        slower = compare(results, args[1])
        same = f"No row more than 5% slower, or no longer ok, than at {old_meta['commit']}."
        print("\n" + ("\n".join(slower) if slower else same))
    eager_table(results, old_results if old else [], before)
    if warm:
        warm_rows = graph_times(warm)
        warm_table(warm_rows)
        perf_conditions(rows, warm_rows)
    if floor:
        floor_table(results, *(float(v) for v in floor.split(",")))


def graph_times(path):
    """{row: {backend: graph µs}} of a results.json's rows that ran."""
    _, results = load(path)
    rows = {}
    for r in results:
        if r.get("graph_us") and r["status"] == "ok":
            rows.setdefault(r["row"], {})[r["backend"]] = r["graph_us"]
    return rows


def warm_table(rows):
    """A ``--warm-l2`` run's ``graph_times`` (no cache rotation: rows that fit in L2 read it from there) against
    PERF.md."""
    print(f"\nWarm L2 (no rotation), graph µs\n\n| row | {OURS} µs | best peer, same run µs | PERF.md peer µs | "
          "vs same run | vs PERF.md |\n|---|---:|---:|---:|---:|---:|")  # fmt: skip
    for name, e in rows.items():
        if OURS not in e:
            continue
        fi, who = best_peer(e)
        peer = PERF_PEER_US.get(name)
        cells = [f"{e[OURS]:.1f}", f"{fi:.1f} ({who})" if fi else "", f"{peer:.1f}" if peer else "",
                 f"{fi / e[OURS]:.2f}×" if fi else "", f"{peer / e[OURS]:.2f}×" if peer else ""]  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + " |")


# PERF.md's 60 MB L2: its times for the anchor rows smaller than that (the four 28/4 rows) are warm-L2 times.
# FlashInfer with tensor cores, timed by `flashdecode bench --warm-l2`, gives PERF.md's numbers there and not with the
# caches rotated (docs/design.md, "The Triton peers, and PERF.md's 28/4 times"); the rows above it read DRAM either way
PERF_L2_MB = 60


def perf_conditions(rows, warm_rows):
    """The anchor geomean against PERF.md with each row timed as PERF.md timed it: the rows under PERF_L2_MB from the
    ``--warm-l2`` run (``warm_rows``, its ``graph_times``), the others from the rotated run (``rows``: row ->
    {backend: µs, "kv_mb": MB})."""
    warm = {name: e[OURS] for name, e in warm_rows.items() if OURS in e}
    speeds, used = [], []
    for name in ANCHOR_ROWS:
        e = rows.get(name, {})
        small = e.get("kv_mb", PERF_L2_MB) < PERF_L2_MB
        us = warm.get(name) if small else e.get(OURS)
        if us is None:
            print(f"\nIn PERF.md's conditions: no {'warm' if small else 'rotated'} time for {name}: not computed")
            return
        speeds.append(PERF_PEER_US[name] / us)
        used += [f"{name} {us:.1f}"] if small else []
    at_least = sum(1 for s in speeds if s >= 1.0)
    print(f"\nIn PERF.md's conditions (rows under its {PERF_L2_MB} MB L2 warm: {', '.join(used)} µs; the rest "
          f"rotated): {geomean(speeds):.4f}× PERF.md's best peer over {len(speeds)} rows ({at_least} at least as "
          "fast).")


def floor_table(results, ceiling_gbps, fixed_us):
    """Each anchor row against an ideal kernel: bytes (K+V of the valid tokens, q, out) / ceiling_gbps + fixed_us.

    The geometric mean of PERF.md's peer over that floor is the most any kernel with that fixed cost can score; our
    time over the floor says where the remaining gap sits.
    """
    ours = {r["row"]: r for r in results if r["backend"] == OURS and r.get("graph_us") and r["status"] == "ok"}
    print(f"\nAgainst an ideal kernel: bytes / {ceiling_gbps:.0f} GB/s + {fixed_us:.1f} µs a call (graph µs)\n")
    print(f"| row | MB | floor µs | {OURS} µs | {OURS} / floor | PERF.md peer / floor |")
    print("|---|---:|---:|---:|---:|---:|")
    ideal, gap = [], []
    for name in ANCHOR_ROWS:
        if name not in ours:
            continue
        r = ours[name]
        t_floor = r["bytes"] / (ceiling_gbps * 1e3) + fixed_us
        ideal.append(PERF_PEER_US[name] / t_floor)
        gap.append(r["graph_us"] / t_floor)
        print(f"| {name} | {r['bytes'] / 1e6:.1f} | {t_floor:.1f} | {r['graph_us']:.1f} | {gap[-1]:.2f} | "
              f"{ideal[-1]:.2f} |")
    print(f"\nOver {len(ideal)} rows: the ideal kernel {geomean(ideal):.3f}× PERF.md's best peer; {OURS} "
          f"{geomean(gap):.3f}× the floor's time.")


def eager_table(results, old_results, before):
    """Eager µs (``do_bench``, no CUDA graph) of auto before / after and of FlashInfer's faster path, same run."""
    old = {r["row"]: r["eager_us"] for r in old_results if r["backend"] == OURS and r.get("eager_us")}
    rows = {}
    for r in results:
        if r.get("eager_us") and r["status"] == "ok":
            rows.setdefault(r["row"], {})[r["backend"]] = r["eager_us"]
    print("\nEager µs (do_bench, host time included)\n")
    print(f"| row | {before} | now µs | best peer, same run µs | vs same run |")
    print("|---|---:|---:|---:|---:|")
    speeds = []
    for name, e in rows.items():
        if OURS not in e:
            continue
        fi, who = best_peer(e)
        speeds += [fi / e[OURS]] if fi else []
        cells = [f"{old[name]:.1f}" if name in old else "", f"{e[OURS]:.1f}", f"{fi:.1f} ({who})" if fi else "",
                 f"{fi / e[OURS]:.2f}×" if fi else ""]  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + " |")
    if speeds:
        print(f"\nEager geomean: {geomean(speeds):.3f}× the fastest peer of the same run over {len(speeds)} rows.")


if __name__ == "__main__":
    main()
