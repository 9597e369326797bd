"""Where a full grid's dual path (``api.FULL_GRID_DUAL_PATH``) spends its time on even batches: `auto` as the single
pass (chained to the calls around it with PDL), as the dual path, as the dual path's single pass alone (its planned
launches dropped: right on even batches only), as the plain single pass unchained, and as the dual path without its
combine launch (the fused merge's limit raised above these rows' tiles). CUDA-graph median of
back-to-back calls (bench.run_rows). Prints a table; writes $OUT/table.jsonl.

    python scripts/full_grid_probe.py
"""

import random

from table_probe import report

from flashdecode import api, launcher, triton_single, triton_splitk
from flashdecode.bench import Row, run_rows


def rows():
    g = random.Random(7)
    return [
        Row([256] * 256, 12, 12), Row([1024] * 64, 12, 12), Row([2048] * 128, 32, 8), Row([512] * 512, 32, 8),
        Row([g.randint(500, 3000) for _ in range(512)], 32, 8, label="512x500..3000 32/8"),
    ]  # fmt: skip


def main():
    chosen, results = rows(), []
    # every table here, short ones too, takes the dual path where a variant asks for it
    api.FULL_GRID_DUAL_MIN_TOKENS = 0
    launch, chain, fused_max = triton_splitk.launch, triton_single.chain_pdl, triton_splitk.FUSED_MAX_CHUNKS
    variants = {
        "single": dict(full=False),
        "dual": dict(full=True),
        "dual single only": dict(full=True, planned=False),
        "single unchained": dict(full=False, chain=False),
        # the fused merge up to 128 chunks: these rows' tables (at most 3032 tokens, 95 tiles) need no combine launch
        "dual no combine": dict(full=True, fused_max=128),
    }
    for name, v in variants.items():
        api.FULL_GRID_DUAL_PATH = v["full"]
        triton_splitk.launch = launch if v.get("planned", True) else (lambda *a, **k: None)
        triton_single.chain_pdl = chain if v.get("chain", True) else (lambda device: False)
        triton_splitk.FUSED_MAX_CHUNKS = v.get("fused_max", fused_max)
        launcher.clear()
        recs = run_rows(chosen, ["auto"], "cuda", progress=False)
        for rec in recs:
            rec["backend"] = name
        results += recs
        print(name, " ".join(f"{r.get('graph_us') or r.get('status')}" for r in recs), flush=True)
    triton_splitk.launch, triton_single.chain_pdl = launch, chain
    report(results, list(variants))


if __name__ == "__main__":
    main()
