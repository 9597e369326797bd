"""The README's benchmark table from bench results: flashdecode (``auto`` and the plan) against each peer of the same
run, with PERF.md's best peer beside them.

    python scripts/readme_table.py RESULTS.json [MORE.json ...] > table.md

Rows keep the order of the files (the anchor grid's, then e.g. ragged and dims); a row's "vs fastest" is the fastest
peer's time over the plan's (FlashInfer's faster path, SGLang's and vLLM's Triton kernels), "PERF.md" is the best peer
time listed in ../shared/PERF.md. The last line names the commit, GPU, versions and the run's read bandwidths (``bench.read_bandwidths``).
"""

import json
import sys

sys.path.insert(0, "scripts")
from anchor_report import PERF_PEER_US, geomean  # noqa: E402

from flashdecode.bench import read_bandwidths  # noqa: E402

PEERS = {"FlashInfer": ("flashinfer", "flashinfer_tc"), "SGLang": ("sglang_triton",), "vLLM": ("vllm_triton",)}


def pretty(row: str) -> str:
    """'64x4096 32/8 D64 P16 bf16' -> '64 × 4096, 32/8, head_dim 64'; labelled rows keep their label."""
    parts = row.split()
    if "x" not in parts[0] or not parts[0].replace("x", "").isdigit():
        return row.replace("x", " × ").replace("+", " + ")
    out = f"{parts[0].replace('x', ' × ')}, {parts[1]}"
    dim = next((p[1:] for p in parts[2:] if p.startswith("D")), None)
    return out + (f", head_dim {dim}" if dim and dim != "128" else "")


def table(paths) -> str:
    by_row, meta = {}, None
    for path in paths:
        data = json.load(open(path))
        meta = meta or data["meta"]
        earlier = set(by_row)  # a row an earlier file timed keeps that file's times (e.g. dims' 128 after anchor)
        for r in data["results"]:
            if r["status"] == "ok" and r.get("graph_us") and r["row"] not in earlier:
                by_row.setdefault(r["row"], {})[r["backend"]] = r
    lines = [
        "| B × S, heads Hq/Hkv | K+V MB | `auto` µs | with plan µs | GB/s | FlashInfer µs | SGLang µs | vLLM µs "
        "| vs fastest | PERF.md µs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = []
    for row, recs in by_row.items():
        plan = recs.get("auto_plan")
        if plan is None:
            continue
        cells = {}
        for name, backends in PEERS.items():
            times = [recs[b]["graph_us"] for b in backends if b in recs]
            cells[name] = min(times) if times else None
        peers = [t for t in cells.values() if t is not None]
        ratio = min(peers) / plan["graph_us"] if peers else None
        if ratio is not None:
            ratios.append(ratio)
        auto = recs.get("auto", {}).get("graph_us")
        perf = PERF_PEER_US.get(row)
        lines.append(
            f"| {pretty(row)} | {plan['kv_bytes'] / 1e6:.0f} | {f'{auto:.1f}' if auto else '-'} | "
            f"{plan['graph_us']:.1f} | {plan['gbps']:.0f} | "
            + " | ".join(f"{cells[n]:.1f}" if cells[n] is not None else "-" for n in PEERS)
            + f" | {f'{ratio:.2f}×' if ratio else '-'} | {perf if perf else '-'} |"
        )
    geo = geomean(ratios)
    lines.append("")
    lines.append(
        f"Geometric mean of \"vs fastest\" over these {len(ratios)} rows: {geo:.3f}×. Commit {meta.get('commit')}, "
        f"{meta.get('gpu')}, torch {meta.get('torch')}, triton {meta.get('triton')}, FlashInfer {meta.get('flashinfer')}; "
        f"{read_bandwidths(meta)} in the same process."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print(table(sys.argv[1:]))
