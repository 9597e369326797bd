"""`auto` (or, for the combine sets, the plan) under variants of the library's switches, each row running every
variant back to back (then the first again: the run's noise), with the other of the two and FlashInfer in the same
process. Each backend is checked against the float64 reference before it is timed (CUDA-graph median, caches
rotated out of L2). Writes $OUT/table.jsonl, prints a table.

    python scripts/variant_probe.py [cut | capacity | capacity4k | capacityfeat | exit | combineblock | smallblock |
                                     inlinefused | combinewarps | combinewide8 | combinewide128 |
                                     sgstages | mhafused]

cut: the device cut counted in int64 (``triton_splitk.NARROW_CUT`` off: a 64-bit division on every program's
path), in int32 where the shapes allow (on), and in int32 with the candidates sized from the row's longest sequence
instead of the table's capacity (``num_candidates``; what a bound read from the lengths would give, the same cut).
Rows in serving-sized tables (T131072) and in their own. (At a16535e a set "mhaslots" measured the MHA tiles'
grid with 4 or 3 slot programs per SM instead of 8: docs/design.md, not kept; at df6c8c1 a set "spread" the busy
programs spread evenly over the in-place grid, at 7b4f0ec a set "one" the capacity's splits for one-sequence batches
in tables of any size, at 18240b7 a set "fill" a dual path for single passes of 1-2 programs per SM with a gate on
short even batches: none kept, docs/design.md.)

capacity: small batches in small tables with the cut computed in place (``api.CAPACITY_SPLITS_MAX_TOKENS`` 0) or
as the fixed splits of full-table lengths (4096); full tables, 2048-token tables of shorter sequences, uneven
batches; capacity4k: the same in tables of 3000-4096 tokens; capacityfeat: e4m3 caches and sliding windows.

inlinefused: calls of at most 16 sequences that fuse the merge, with the planner launch or planned in place after a
kernel that zeroes the merge counters (``INLINE_FUSED_MAX_BATCH`` 0 or 16; at 517dc88 a third column had the partial
kernel wait for that kernel only before its merge: slower on 13 of 15 rows, not kept); inlinefused64: the same for
17-64 sequences (``INLINE_FUSED_MAX_BATCH`` 16, 32 or 64). inlinelong: the inlinefused rows with the combine after an
in-place plan run for every sequence (all) or for those that can have more than FUSED_MAX_CHUNKS chunks
(``COMBINE_LONG_ONLY``; at 337168d a knob of its own for the in-place plans).

mhafused: the plan on rows of the "mha" tile class with few (sequence, row) pairs, their fixed splits merged by the
combine launch or in the last split program (``triton_splitk.FIXED_MERGE_MHA_ANY_PAIRS``).

(At 79aa6a4 a set "guess" timed the plan on ten anchor rows with a chained call's first kernel loading its length and
first page ids after the PDL wait or guessing them before it, checked after: no row faster, 8 x 2048 28/4 12.6 ->
13.0 us, 64 x 4096 32/8 245.9 -> 247.9; reverted, docs/design.md.)

sgstages: `auto` on rows of the small-group split tile (``SMALL_GROUP_SPLIT_TILE``) with 3 or 2 stages.
(At bd8443c a set "mergewide" timed the plan's fixed splits of one MHA row merged in the last split program with one
[S, D] load instead of the combine launch: slower on 9 of 11 rows, not kept; docs/design.md.)

combinewarps: the plan (not `auto`) on rows whose combine launch takes the wide shape, merged by four warps or, for
tiles of at most 4096 elements, one (``triton_splitk.COMBINE_ONE_WARP_MAX``), `auto` and FlashInfer beside;
combinewide128: `auto` with the wide combine's planned blocks of 256 chunks (four warps: 16 barriers) or 128 (one
warp: ptxas 168 registers, no spill; a sequence of more than 128 chunks loads twice, one after the other);
combinewide8: the plan's wide combine of fixed splits over 4 or 8 head-dim blocks (``COMBINE_WIDE``; one warp for
[S, 32] or [S, 16] tiles: ptxas 142 registers at [128, 16]).
Both measured on the H200 at db2cde0, neither kept (docs/benchmarks/h200-2026-11-28/no-peers-db2cde0: 8 blocks no
row faster beyond noise; 128 × 1 warp mixed, 1 × 4096 32/8 10.5 → 10.1 µs, 1 × 131072 12/2 38.8 → 39.5).

exit: rows planned in place, with every chunk slot computing the cut (cut) or the slots past the most chunks the
lengths allow returning before it (``triton_splitk.INLINE_EXIT``); combineblock: the same rows with the combine
reading 64, 32 or 16 chunks at a time (``triton_splitk.COMBINE_BLOCK_S``); smallblock: the in-place plan's combine
at 64 chunks a block, or a sequence of at most 16 in one block of 16 (``COMBINE_INLINE_SMALL_S``; at 63765e6 a set
"inlineblock" took every sequence 16 chunks at a time: uneven rows up to 30% slower), on even and uneven rows with
many (sequence, row) pairs.
"""

import sys

from table_probe import report

from flashdecode import api, launcher, triton_splitk
from flashdecode.bench import SERVING_TABLE_TOKENS, Row, run_rows

SHAPES = [(1, 512, 12, 12), (4, 1024, 12, 12), (16, 1024, 12, 12), (16, 4096, 12, 12), (64, 1024, 12, 2),
          (16, 4096, 12, 2), (8, 2048, 28, 4), (1, 2048, 28, 4)]  # fmt: skip
CONTROLS = [(1, 512, 12, 12), (4, 1024, 12, 12), (16, 4096, 12, 12), (8, 2048, 28, 4), (4, 16384, 12, 12),
            (1, 65536, 12, 12), (1, 131072, 12, 12), (1, 65536, 12, 2), (1, 32768, 32, 32)]

# small batches in small tables: full tables (the benchmark's: the longest sequence's pages and 2 more), tables of
# 2048 tokens holding shorter sequences, and uneven batches in them
SMALL = [(1, 256, 28, 4), (1, 1024, 28, 4), (1, 2048, 28, 4), (8, 256, 28, 4), (8, 512, 28, 4), (8, 1024, 28, 4),
         (8, 2048, 28, 4), (4, 1024, 12, 2), (16, 2048, 12, 2), (4, 1024, 12, 12), (2, 2048, 32, 8)]
SMALL_FEAT = [(8, 2048, 28, 4), (8, 512, 28, 4), (4, 1024, 12, 2), (1, 2048, 28, 4), (4, 1024, 12, 12)]
LOOSE = [(1, 256, 28, 4), (8, 256, 28, 4), (8, 512, 28, 4), (16, 256, 12, 2), (4, 256, 12, 12), (8, 128, 32, 8)]

# in-place rows: MHA (the grid's chunk slots first) and grouped (heads first), own tables and serving-sized ones
INPLACE_OWN = [(1, 131072, 12, 12), (1, 65536, 12, 12), (4, 16384, 12, 12), (16, 4096, 12, 12), (1, 32768, 32, 32),
               (1, 8192, 40, 40), (16, 4096, 12, 2), (4, 16384, 12, 2), (1, 131072, 12, 2), (2, 4000, 32, 8)]
INPLACE_T = [(1, 32768, 40, 40), (1, 512, 12, 12), (4, 1024, 12, 12), (16, 1024, 12, 12), (1, 2048, 28, 4),
             (8, 2048, 28, 4), (8, 512, 28, 4), (4, 1024, 12, 2)]

# planned calls of <= 16 sequences with the fused merge (B * Hq >= #SMs, few chunks expected a sequence)
INLINE_FUSED_OWN = [(16, 4096, 12, 12), (12, 4096, 12, 12), (12, 2048, 12, 12), (16, 4096, 32, 8), (16, 2048, 32, 8),
                    (16, 1024, 32, 8), (16, 2048, 16, 16)]
INLINE_FUSED_T = [(16, 1024, 12, 12), (16, 512, 32, 8), (16, 4096, 32, 8)]
INLINE_FUSED_64 = [(64, 1024, 12, 2), (48, 1024, 12, 2), (48, 2048, 12, 2), (32, 2048, 32, 8), (20, 4096, 12, 12),
                   (40, 1024, 28, 4), (64, 512, 12, 2)]
INLINE_FUSED_64_T = [(64, 512, 12, 2), (32, 1024, 32, 8), (24, 2048, 28, 4)]

# the anchor rows whose plan launches the combine (its wide shape: B * Hq < #SMs), small fixed-split rows beside them,
# and two rows that merge in the partial kernel (controls)
WIDE_COMBINE = [(4, 16384, 12, 12), (1, 65536, 12, 12), (1, 131072, 12, 12), (1, 8192, 32, 32), (1, 32768, 32, 32),
                (4, 16384, 12, 2), (1, 65536, 12, 2), (1, 131072, 12, 2), (1, 2048, 28, 4), (1, 4096, 12, 2),
                (2, 2048, 12, 2), (1, 2048, 12, 2), (2, 4096, 12, 2), (1, 8192, 12, 2), (1, 1024, 28, 4),
                (1, 4096, 28, 4), (2, 2048, 28, 4), (1, 4096, 32, 8), (16, 4096, 12, 2), (8, 2048, 28, 4)]

# rows of the small-group split tile (groups 1-2, a power-of-two token row), planned by `auto`
SMALL_GROUP = [(1, 8192, 32, 32), (1, 32768, 32, 32), (1, 131072, 32, 32), (1, 16384, 32, 32), (2, 8192, 32, 32),
               (1, 8192, 16, 16), (1, 131072, 8, 8), (1, 16384, 32, 16), (8, 4096, 32, 32)]

# fixed splits of the "mha" tile class (12/12, 40/40, 24/12) that the plan merged by the combine launch for want of
# (sequence, row) pairs: S 2-4, long and short sequences; and two controls that do not change
MHA_FUSED = [(6, 8192, 12, 12), (8, 8192, 12, 12), (2, 8192, 40, 40), (8, 16384, 12, 12), (8, 32768, 12, 12),
             (2, 32768, 40, 40), (1, 256, 12, 12), (1, 512, 12, 12), (2, 512, 12, 12), (4, 512, 12, 12),
             (1, 512, 40, 40), (2, 1024, 40, 40), (1, 512, 24, 12), (2, 512, 24, 12), (4, 512, 24, 12),
             (16, 4096, 12, 12), (4, 16384, 12, 12)]  # fmt: skip

# {set: (rows, [(column, {constant: value}, candidates from the longest sequence)]); a constant "api.NAME" is
# flashdecode.api's, any other triton_splitk's
VARIANTS = {
    "cut": ((SHAPES, CONTROLS), [("int64", dict(NARROW_CUT=False), False), ("int32", dict(NARROW_CUT=True), False),
                                 ("i32 fit", dict(NARROW_CUT=True), True)]),
    "capacity4k": ("small4k", [("in place", {"api.CAPACITY_SPLITS_MAX_TOKENS": 0}, False),
                               ("capacity", {"api.CAPACITY_SPLITS_MAX_TOKENS": 4096}, False)]),
    "capacityfeat": ("feat", [("in place", {"api.CAPACITY_SPLITS_MAX_TOKENS": 0}, False),
                              ("capacity", {"api.CAPACITY_SPLITS_MAX_TOKENS": 2560}, False)]),
    "exit": ("inplace", [("cut", dict(INLINE_EXIT=False), False), ("exit", dict(INLINE_EXIT=True), False)]),
    "combineblock": ("inplace", [("S64", dict(COMBINE_BLOCK_S=64), False), ("S32", dict(COMBINE_BLOCK_S=32), False),
                                 ("S16", dict(COMBINE_BLOCK_S=16), False)]),
    "smallblock": ("inlineblock", [("S64", dict(COMBINE_INLINE_SMALL_S=0), False),
                                   ("small16", dict(COMBINE_INLINE_SMALL_S=16), False)]),
    "inlinefused": ("inlinefused", [("planner", dict(INLINE_FUSED_MAX_BATCH=0), False),
                                     ("zero", dict(INLINE_FUSED_MAX_BATCH=16), False)]),
    "inlinelong": ("inlinefused", [("all", dict(COMBINE_LONG_ONLY=False), False),
                                   ("long only", dict(COMBINE_LONG_ONLY=True), False)]),
    "inlinefused64": ("inlinefused64", [("planner", dict(INLINE_FUSED_MAX_BATCH=16), False),
                                         ("in place 32", dict(INLINE_FUSED_MAX_BATCH=32), False),
                                         ("in place 64", dict(INLINE_FUSED_MAX_BATCH=64), False)]),
    "capacity": ("small", [("in place", {"api.CAPACITY_SPLITS_MAX_TOKENS": 0}, False),
                           ("capacity", {"api.CAPACITY_SPLITS_MAX_TOKENS": 4096}, False)]),
    "combinewarps": ("widecombine", [("4 warps", dict(COMBINE_ONE_WARP_MAX=0), False),
                                     ("1 warp", dict(COMBINE_ONE_WARP_MAX=4096), False)]),
    "combinewide8": ("widecombine", [("4 blocks", dict(COMBINE_WIDE=(256, 4)), False),
                                     ("8 blocks", dict(COMBINE_WIDE=(256, 8)), False)]),
    "combinewide128": ("widecombine", [("256 x 4 warps", dict(COMBINE_WIDE=(256, 4)), False),
                                       ("128 x 1 warp", dict(COMBINE_WIDE=(128, 4)), False)]),
    "sgstages": ("smallgroup", [("3 stages", dict(SMALL_GROUP_SPLIT_TILE=dict(BLOCK_N=64, num_stages=3)), False),
                                ("2 stages", dict(SMALL_GROUP_SPLIT_TILE=dict(BLOCK_N=64, num_stages=2)), False)]),
    "mhafused": ("mhafused", [("combine", dict(FIXED_MERGE_MHA_ANY_PAIRS=False), False),
                              ("merged", dict(FIXED_MERGE_MHA_ANY_PAIRS=True), False)]),
}  # fmt: skip
# sets whose variants time the plan (``plan_decode``) instead of ``auto``
PLAN_SETS = {"combinewarps", "combinewide8", "mhafused"}


def rows(shapes):
    if shapes == "feat":
        fp8 = [Row([s] * b, hq, hkv, kv_dtype="e4m3") for b, s, hq, hkv in SMALL_FEAT]
        window = [Row([2048] * 8, 28, 4, window_left=511), Row([2048] * 4, 12, 2, window_left=255),
                  Row([2048, 100, 700, 30], 12, 2, window_left=1023)]  # fmt: skip
        return fp8 + window
    if shapes == "small4k":
        full = [(1, 4000, 28, 4), (8, 3000, 28, 4), (4, 4000, 12, 2), (16, 3000, 12, 2), (2, 4000, 32, 8),
                (4, 3500, 12, 12)]  # fmt: skip
        loose = [(8, 1024, 28, 4), (4, 512, 12, 2), (1, 1024, 28, 4)]
        uneven = [Row([4000] + [100] * 7, 28, 4, table_tokens=4096, label="8x100..4000 28/4 T4096"),
                  Row([3000, 200, 1000, 50], 12, 2, table_tokens=4096, label="4x50..3000 12/2 T4096")]  # fmt: skip
        return ([Row([s] * b, hq, hkv) for b, s, hq, hkv in full]
                + [Row([s] * b, hq, hkv, table_tokens=4096) for b, s, hq, hkv in loose] + uneven)  # fmt: skip
    if shapes == "inlineblock":
        own = [Row([s] * b, hq, hkv) for b, s, hq, hkv in ((16, 4096, 12, 2), (16, 4096, 12, 12), (12, 8192, 12, 2))]
        big = [Row([s] * b, hq, hkv, table_tokens=SERVING_TABLE_TOKENS)
               for b, s, hq, hkv in ((8, 2048, 28, 4), (8, 512, 28, 4), (16, 1024, 12, 12), (16, 1024, 12, 2))]
        uneven = [Row([30000] + [500] * 15, 12, 2, label="16x500..30000 12/2"),
                  Row([100 + (i * 1583) % 7900 for i in range(16)], 28, 4, label="16x100..8000 28/4"),
                  Row([2048] + [64] * 7, 28, 4, table_tokens=SERVING_TABLE_TOKENS, label="8x64..2048 28/4 T131072"),
                  Row([50000] + [100] * 11, 12, 2, label="12x100..50000 12/2"),
                  Row([65536] * 1, 12, 12, label="1x65536 12/12 (wide)")]  # fmt: skip
        return own + big + uneven
    if shapes == "inlinefused":
        own = [Row([s] * b, hq, hkv) for b, s, hq, hkv in INLINE_FUSED_OWN]
        big = [Row([s] * b, hq, hkv, table_tokens=SERVING_TABLE_TOKENS) for b, s, hq, hkv in INLINE_FUSED_T]
        uneven = [Row([100 + (i * 1583) % 7900 for i in range(16)], 32, 8, label="16x100..8000 32/8"),
                  Row([100, 7000, 300, 2500, 40, 1200, 900, 5000, 64, 3000, 700, 20], 12, 12,
                      label="12x20..7000 12/12"),
                  Row([2048] + [64] * 15, 32, 8, table_tokens=SERVING_TABLE_TOKENS, label="16x64..2048 32/8 T131072")]
        controls = [Row([s] * b, hq, hkv) for b, s, hq, hkv in ((1, 65536, 12, 12), (8, 2048, 28, 4))]
        return own + big + uneven + controls
    if shapes == "inlinefused64":
        own = [Row([s] * b, hq, hkv) for b, s, hq, hkv in INLINE_FUSED_64]
        big = [Row([s] * b, hq, hkv, table_tokens=SERVING_TABLE_TOKENS) for b, s, hq, hkv in INLINE_FUSED_64_T]
        uneven = [Row([64 + (i * 977) % 1985 for i in range(64)], 12, 2, label="64x64..2048 12/2"),
                  Row([100 + (i * 1583) % 3900 for i in range(32)], 32, 8, label="32x100..4000 32/8"),
                  Row([8000] + [300] * 23, 28, 4, table_tokens=SERVING_TABLE_TOKENS, label="24x300..8000 28/4 T131072")]
        controls = [Row([s] * b, hq, hkv) for b, s, hq, hkv in ((16, 4096, 32, 8), (128, 1024, 12, 2))]
        return own + big + uneven + controls
    if shapes == "inplace":
        own = [Row([s] * b, hq, hkv) for b, s, hq, hkv in INPLACE_OWN]
        big = [Row([s] * b, hq, hkv, table_tokens=SERVING_TABLE_TOKENS) for b, s, hq, hkv in INPLACE_T]
        uneven = [Row([100, 7000, 300, 2500, 40, 1200, 900, 5000], 12, 12, label="8x40..7000 12/12"),
                  Row([20000, 500, 3000, 64], 12, 2, label="4x64..20000 12/2"),
                  Row([30, 400, 2, 90], 12, 12, table_tokens=SERVING_TABLE_TOKENS, label="4x2..400 12/12 T131072")]
        return own + big + uneven
    if shapes == "mhafused":
        return [Row([s] * b, hq, hkv) for b, s, hq, hkv in MHA_FUSED]
    if shapes == "smallgroup":
        return [Row([s] * b, hq, hkv) for b, s, hq, hkv in SMALL_GROUP]
    if shapes == "widecombine":
        return [Row([s] * b, hq, hkv) for b, s, hq, hkv in WIDE_COMBINE]
    if shapes == "small":
        uneven = [Row([2048] + [64] * 7, 28, 4, label="8x64..2048 28/4"),
                  Row([1500, 100, 300, 40], 12, 2, table_tokens=2048, label="4x40..1500 12/2 T2048"),
                  Row([200, 900, 30, 600, 2000, 10, 50, 1200], 28, 4, label="8x10..2000 28/4")]  # fmt: skip
        loose = [Row([s] * b, hq, hkv, table_tokens=2048) for b, s, hq, hkv in LOOSE]
        return [Row([s] * b, hq, hkv) for b, s, hq, hkv in SMALL] + loose + uneven
    shapes, controls = shapes
    big = [Row([s] * b, hq, hkv, table_tokens=SERVING_TABLE_TOKENS) for b, s, hq, hkv in shapes]
    uneven = [Row([100, 7000, 300, 2500, 40, 1200, 900, 5000], 12, 12, label="8x40..7000 12/12")]
    return big + [Row([s] * b, hq, hkv) for b, s, hq, hkv in controls] + uneven


def module_of(constant):
    return (api, constant[4:]) if constant.startswith("api.") else (triton_splitk, constant)


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "cut"
    shapes, columns = VARIANTS[which]
    backend = "auto_plan" if which in PLAN_SETS else "auto"
    defaults = {k: getattr(*module_of(k)) for _, settings, _ in columns for k in settings}
    table_sized = triton_splitk.num_candidates
    results = []
    for row in rows(shapes):
        longest = max(row.seqlens)
        for name, settings, fit in columns + [(columns[0][0] + " again",) + columns[0][1:]]:
            for constant, value in settings.items():
                setattr(*module_of(constant), value)
            triton_splitk.num_candidates = (
                lambda t, n, cap=longest: table_sized(min(t, cap), n)) if fit else table_sized
            launcher.clear()  # no launch replayed from the other variant's recording
            for rec in run_rows([row], [backend], "cuda", progress=False):
                rec["backend"] = name
                results.append(rec)
                print(name, row.name(), rec.get("graph_us") or rec.get("status"), flush=True)
    triton_splitk.num_candidates = table_sized
    for constant, value in defaults.items():
        setattr(*module_of(constant), value)
    others = ["auto"] if backend == "auto_plan" else ["auto_plan"]
    results += run_rows(rows(shapes), others + ["flashinfer"], "cuda", progress=False)
    report(results, [c[0] for c in columns] + [columns[0][0] + " again"] + others + ["flashinfer"])


if __name__ == "__main__":
    main()
