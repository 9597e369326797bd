"""Where a full grid's dual path (``api.FULL_GRID_DUAL_PATH``) spends its time on batches the single pass keeps, and
what a combine launched for the long sequences only (``triton_splitk.COMBINE_LONG_ONLY``) saves: `auto` with each
variant below on full-grid rows, rule 4's 64 x 4096 32/8 and the ragged row. CUDA-graph median of back-to-back calls
(bench.run_rows). Prints a table; writes $OUT/table.jsonl.

    python scripts/full_grid_probe.py [--cost]   # --cost: the variants that take the dual path's cost apart
"""

import random
import sys

from table_probe import report

from flashdecode import api, launcher, triton_single, triton_splitk
from flashdecode.bench import Row, run_rows


def rows():
    g = random.Random(7)
    tail = [g.randint(256, 2048) for _ in range(120)] + [g.randint(16384, 32768) for _ in range(8)]
    g.shuffle(tail)
    return [
        Row([256] * 256, 12, 12), Row([1024] * 64, 12, 12), Row([2048] * 128, 32, 8), Row([512] * 512, 32, 8),
        Row([g.randint(500, 3000) for _ in range(512)], 32, 8, label="512x500..3000 32/8"),
        Row([4096] * 64, 32, 8), Row([131072] + [1024] * 63, 32, 8, label="ragged 32/8"),
        Row(tail, 32, 8, label="128 long tail 32/8"),
        Row([1024] * 127 + [131072], 32, 8, label="127x1024 + 131072 32/8"),
    ]  # fmt: skip


def main():
    chosen, results = rows(), []
    # every table here, short ones too, takes the dual path where a variant asks for it
    api.FULL_GRID_DUAL_MIN_TOKENS = 0
    launch, chain, fused_max = triton_splitk.launch, triton_single.chain_pdl, triton_splitk.FUSED_MAX_CHUNKS
    variants = {
        "single": dict(full=False),
        "dual": dict(full=True, long_only=False),
        "dual long-only": dict(full=True),
    }
    if "--cost" in sys.argv:
        # as measured before COMBINE_LONG_ONLY (sweeps/full-grid-dual-00e8721)
        variants = {
            "single": dict(full=False),
            "dual": dict(full=True, long_only=False),
            "dual single only": dict(full=True, planned=False),
            "single unchained": dict(full=False, chain=False),
            # the fused merge up to 128 chunks: the short rows' tables (at most 3032 tokens, 95 tiles) need no
            # combine launch
            "dual no combine": dict(full=True, fused_max=128, long_only=False),
        }
        chosen = chosen[:5]
    for name, v in variants.items():
        api.FULL_GRID_DUAL_PATH = v["full"]
        triton_splitk.launch = launch if v.get("planned", True) else (lambda *a, **k: None)
        triton_single.chain_pdl = chain if v.get("chain", True) else (lambda device: False)
        triton_splitk.FUSED_MAX_CHUNKS = v.get("fused_max", fused_max)
        triton_splitk.COMBINE_LONG_ONLY = v.get("long_only", True)
        launcher.clear()
        recs = run_rows(chosen, ["auto"], "cuda", progress=False)
        for rec in recs:
            rec["backend"] = name
        results += recs
        print(name, " ".join(f"{r.get('graph_us') or r.get('status')}" for r in recs), flush=True)
    triton_splitk.launch, triton_single.chain_pdl, triton_splitk.FUSED_MAX_CHUNKS = launch, chain, fused_max
    report(results, list(variants))


if __name__ == "__main__":
    main()
