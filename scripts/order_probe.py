"""The full-grid single pass's dispatch, `auto` with each of two variants on the full-grid rows `auto` used to run
single-pass, uniform (what a variant costs) and uneven (what it buys), with the plan and FlashInfer (tensor cores) in
the same process. Each backend is checked against the float64 reference before it is timed (CUDA-graph median,
caches rotated out of L2). Writes $OUT/table.jsonl, prints a table.

    python scripts/order_probe.py [--quick] [--variants order|full|planner]

order: longest-first dispatch (``triton_single.LONGEST_FIRST_MAX_BATCH``) off and on; full (the default): the full
grid's dual path (``api.FULL_GRID_DUAL_PATH``) off (the single pass, longest first) and on; planner: the device
planner's dispatch order (``triton_splitk.PLANNER_ORDER``: sequence order, longest first) and equal chunks
(``PLANNER_EQUAL``, with the order), on its own rows (uneven planned batches, full grids with stragglers, even
controls). --quick: the first uniform and the first two uneven rows.
"""

import functools
import random
import sys

from table_probe import report

from flashdecode import api, launcher, triton_single, triton_splitk
from flashdecode.bench import Row, run_rows

# {name: (module, [(column, {constant: value})])}
VARIANTS = {
    "order": (triton_single, [("in order", dict(LONGEST_FIRST_MAX_BATCH=0)),
                              ("ordered", dict(LONGEST_FIRST_MAX_BATCH=512))]),
    "full": (api, [("single", dict(FULL_GRID_DUAL_PATH=False)), ("dual", dict(FULL_GRID_DUAL_PATH=True))]),
    "planner": (triton_splitk, [("seq order", dict(PLANNER_ORDER=False, PLANNER_EQUAL=False)),
                                ("ordered", dict(PLANNER_ORDER=True, PLANNER_EQUAL=False)),
                                ("ord+equal", dict(PLANNER_ORDER=True, PLANNER_EQUAL=True))]),
}  # fmt: skip


def _uneven(g, batch, low, high, hq, hkv):
    return Row([g.randint(low, high) for _ in range(batch)], hq, hkv, label=f"{batch}x{low}..{high} {hq}/{hkv}")


def _tail(g, short, long, hq, hkv, label=""):
    """`short` sequences of 256..2048 tokens and `long` of 16k..32k, shuffled."""
    lens = [g.randint(256, 2048) for _ in range(short)] + [g.randint(16384, 32768) for _ in range(long)]
    g.shuffle(lens)
    return Row(lens, hq, hkv, label=label or f"{short}x256..2048 + {long}x16k..32k {hq}/{hkv}")


def planner_rows():
    """Batches the device planner cuts (not full grids, or full grids' dual path): even controls first."""
    g = random.Random(11)
    uneven, tail = functools.partial(_uneven, g), functools.partial(_tail, g)
    return [
        Row([1024] * 64, 12, 2), Row([3064] * 64, 32, 8), Row([2048] * 8, 28, 4), Row([131072] + [1024] * 63, 32, 8),
        uneven(200, 100, 8000, 12, 2), uneven(48, 256, 16000, 32, 8), uneven(40, 100, 32000, 32, 8),
        uneven(24, 1272, 7827, 28, 4), uneven(96, 100, 6000, 12, 12), tail(60, 4, 32, 8), tail(120, 8, 32, 8),
        tail(240, 16, 12, 2), Row([1024] * 127 + [131072], 32, 8, label="127x1024 + 131072 32/8"),
        Row([2048] * 120 + [12288] * 8, 32, 8, label="120x2048 + 8x12288 32/8"),
    ]  # fmt: skip


def rows():
    g = random.Random(7)
    uneven = functools.partial(_uneven, g)

    def straggle(short, long, hq, hkv):
        return Row([short] * 120 + [long] * 8, hq, hkv, label=f"120x{short} + 8x{long} {hq}/{hkv}")

    tail = _tail(g, 120, 8, 32, 8, label="128 long tail 32/8")
    return [
        Row([256] * 256, 12, 12), Row([1024] * 64, 12, 12), Row([2048] * 256, 32, 8), Row([2048] * 128, 32, 8),
        Row([512] * 512, 32, 8), Row([4096] * 256, 28, 4),
        uneven(128, 1024, 8192, 32, 8), uneven(256, 256, 4096, 32, 8), uneven(512, 500, 3000, 32, 8),
        uneven(160, 100, 16000, 32, 8), uneven(264, 1000, 8000, 28, 4), uneven(128, 1024, 8192, 12, 12),
        tail,
        # around the full grid's gate (max L * span <= 1.5 * sum L; span 66 sequences at 32/8, 33 at 12/12): ratios
        # 1.38, 1.74, 2.36 at 32/8; 1.18, 1.83 at 12/12; the ragged row's shape in a full grid (ratio 33)
        straggle(2048, 6144, 32, 8), straggle(2048, 8192, 32, 8), straggle(2048, 12288, 32, 8),
        straggle(2048, 12288, 12, 12), straggle(2048, 24576, 12, 12),
        Row([1024] * 127 + [131072], 32, 8, label="127x1024 + 131072 32/8"), Row([8192] * 128, 32, 8),
    ]  # fmt: skip


def main():
    variant = sys.argv[sys.argv.index("--variants") + 1] if "--variants" in sys.argv else "full"
    chosen = planner_rows() if variant == "planner" else rows()
    if "--quick" in sys.argv:
        chosen = chosen[:1] + chosen[6:8]
    module, columns = VARIANTS[variant]
    results = []
    for name, settings in columns:
        for constant, value in settings.items():
            setattr(module, constant, value)
        launcher.clear()  # no launch replayed from the other variant's recording
        recs = run_rows(chosen, ["auto"], "cuda", progress=False)
        for rec in recs:
            rec["backend"] = name
        results += recs
        print(name, " ".join(f"{r.get('graph_us') or r.get('status')}" for r in recs), flush=True)
    results += run_rows(chosen, ["auto_plan", "flashinfer_tc"], "cuda", progress=False)
    report(results, [name for name, _ in columns] + ["auto_plan", "flashinfer_tc"])


if __name__ == "__main__":
    main()
