"""Split-K overhead probe on the GPU: where the time of the planned path goes, and what a variant of the module switches
buys. Set VARIANTS to the switches under test (`dual`: the dual-path call against the planned path and the single pass;
before: on the fused merge's rows, the combine launch instead of the fused merge, with the planner kernel or the cut
computed in place for batches up to 256; before: the combine planning in place before its PDL wait against reading
counts the partial programs published, at 5b7ac97; the combine's block of chunks; fewer chunk slots,
EXTRA_PROGRAMS_PER_SM; earlier: PDL, the heads-first partial grid, the slot plan (docs/design.md), the planner's target
by tile, the in-place plan, the fused merge, combine shapes, split tiles). Writes $OUT/probe.jsonl (one line per row x
variant) and $OUT/profile.txt (per-kernel GPU time from torch.profiler, for the variants in PROFILED); prints every
variant's graph µs per row last.

    python scripts/perf_probe.py            # head dim 128 rows
    python scripts/perf_probe.py deep       # head dim 256 rows (the single pass on every row)
    python scripts/perf_probe.py fused      # the fused merge's rows
    python scripts/perf_probe.py dual       # 2-4 single-pass programs per SM: dual-path call, planned, single
    python scripts/perf_probe.py waves      # the planner's cost in waves of resident programs
    python scripts/perf_probe.py threshold  # uneven batches around the dual path's evenness threshold
    python scripts/perf_probe.py quant      # single-pass MHA rows around the anchor batches: time per byte by B
    python scripts/perf_probe.py cliff      # B * Hkv just past a multiple of R * #SMs: single pass against planned
    python scripts/perf_probe.py cliff2     # more of them: fuller last waves, two full waves, short and long rows
    python scripts/perf_probe.py gate       # there, the dual-path call with its length gate against both paths
    python scripts/perf_probe.py gate2      # the same for the small-group split tile (32/32) and head dim 256
    python scripts/perf_probe.py scan       # auto and the single pass across batch sizes: µs per sequence by B
    python scripts/perf_probe.py scan-plot probe.jsonl scan.png   # ...drawn
    python scripts/perf_probe.py low        # auto's dual path from 1.75 single-pass programs per SM instead of 2
    python scripts/perf_probe.py overhead   # the cost model's per-chunk fixed cost, 32 (rule) to 256 tokens
    python scripts/perf_probe.py slots      # more chunk slots in the planned grid (EXTRA_PROGRAMS_PER_SM 12, 16)
    python scripts/perf_probe.py wider      # 1.5-1.7 waves with the gate's slots: single pass against planned
    python scripts/perf_probe.py split      # the tail split (single pass for the full waves, planned for the rest)
    python scripts/perf_probe.py small      # 1-2 single-pass programs per SM: the planned cut against fixed splits
    python scripts/perf_probe.py fusedtile  # the fused merge's tile, grid order and merge against fixed splits
    python scripts/perf_probe.py grid       # the planned launch's grid (exact, idle slots, order) against fixed
    python scripts/perf_probe.py grid2      # trailing idle CTAs: fixed splits padded to 4, 8 per SM, planned slots
"""

import itertools
import json
import os
import sys

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import api, decode_attention, launcher, triton_common, triton_splitk
from flashdecode.bench import ProbeLog, Row, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense
from flashdecode.triton_single import decode_single

ROWS = [
    Row([4096] * 16, 12, 12), Row([16384] * 4, 12, 12), Row([65536], 12, 12), Row([131072], 12, 12),
    Row([8192], 32, 32), Row([32768], 32, 32), Row([2048] * 8, 28, 4), Row([2048], 28, 4),
    Row([256] * 256, 12, 2), Row([1024] * 64, 12, 2), Row([4096] * 16, 12, 2), Row([65536], 12, 2),
    Row([131072] + [1024] * 63, 32, 8), Row([3064] * 64, 32, 8),
]  # fmt: skip
# `perf_probe.py fused`: the fused merge's rows, where the planner mostly keeps one chunk per sequence
FUSED_ROWS = [
    Row([4096] * 64, 32, 8), Row([3064] * 64, 32, 8), Row([131072] + [1024] * 63, 32, 8), Row([256] * 256, 12, 2),
    Row([1024] * 64, 12, 2), Row([1024] * 16, 32, 8), Row([4096] * 16, 12, 12),
]  # fmt: skip
# `perf_probe.py deep`: head dim 256 (the "deep" tile class), where one program fills an SM's shared memory
DEEP_ROWS = [
    Row([8192], 32, 8, 256), Row([32768], 32, 8, 256), Row([4096] * 8, 32, 8, 256), Row([4096] * 16, 32, 8, 256),
    Row([4096] * 32, 32, 8, 256), Row([4096] * 64, 32, 8, 256), Row([16384] * 4, 16, 16, 256),
]  # fmt: skip
# `perf_probe.py dual`: rows with 2-4 single-pass programs per SM (auto's dual-path range on the H200),
# even and not: the planned path, the dual-path call and the single pass alone
DUAL_ROWS = [
    Row([256] * 256, 12, 2), Row([4096] * 64, 32, 8), Row([3064] * 64, 32, 8), Row([131072] + [1024] * 63, 32, 8),
    Row([512] * 192, 12, 2), Row([2048] * 40, 32, 8), Row([2560 + i * 37 % 513 for i in range(64)], 32, 8),
    Row([1024 + i * 389 % 3073 for i in range(64)], 32, 8), Row([1024] * 64, 12, 2),
]  # fmt: skip
DUAL_VARIANTS = [
    ("rule", dict(), "planned"), ("dual", dict(), "dual"), ("single", dict(), "single"),
    ("single_even", dict(), "single_even"), ("rule_again", dict(), "planned"), ("dual_again", dict(), "dual"),
]
# `perf_probe.py waves`: planned rows of more than 16 sequences (the planner kernel), uneven and even, for the
# planner's cost in waves of resident programs (WAVE_SATURATION; "rule" is the default, {4: 3, 3: 3, 2: 2})
WAVES_ROWS = [
    Row([1500 + i * 97 % 1100 for i in range(40)], 32, 8), Row([2048] * 40, 32, 8),
    Row([300 + i * 61 % 500 for i in range(192)], 12, 2), Row([512] * 192, 12, 2),
    Row([1024 + i * 389 % 3073 for i in range(64)], 32, 8), Row([131072] + [1024] * 63, 32, 8),
    Row([2048 + i * 251 % 3953 for i in range(32)], 32, 8), Row([500 + i * 37 % 1000 for i in range(128)], 12, 2),
    Row([1024] * 64, 12, 2), Row([256] * 256, 12, 2), Row([4096] * 64, 32, 8),
    Row([2560 + i * 37 % 513 for i in range(64)], 32, 8),
]  # fmt: skip
WAVES_VARIANTS = [
    ("rule", dict(), "planned"), ("no_waves", dict(WAVE_SATURATION=None), "planned"),
    ("w_same", dict(WAVE_SATURATION={4: 4, 3: 3, 2: 2}), "planned"),
    ("w2", dict(WAVE_SATURATION={4: 2, 3: 2, 2: 2}), "planned"),
    ("single", dict(), "single"), ("rule_again", dict(), "planned"),
]
# `perf_probe.py threshold`: uneven batches in the dual-path range around its evenness threshold (max / mean 1.12,
# 1.16, 1.23, 1.25, 1.38): the planned path against the single pass
THRESHOLD_ROWS = [
    Row([3584 + i * 16 % 1025 for i in range(64)], 32, 8), Row([3000 + i * 31 % 2001 for i in range(64)], 32, 8),
    Row([200 + i * 7 % 121 for i in range(256)], 12, 2), Row([160 + i * 3 % 193 for i in range(256)], 12, 2),
    Row([1700 + i * 17 % 701 for i in range(40)], 32, 8),
]  # fmt: skip
# `perf_probe.py quant`: the single pass on 12/12 batches around 64 x 1024 and 256 x 256 (768 and 3072 programs,
# 5.8 and 23.3 per SM): does the time per byte step with the programs per SM?
QUANT_ROWS = [Row([1024] * b, 12, 12) for b in range(56, 73, 2)] + [Row([256] * b, 12, 12) for b in range(240, 273, 8)]
QUANT_VARIANTS = [("single", dict(), "single")]
# `perf_probe.py cliff`: uniform batches whose single pass (auto's rule 3) leaves a last wave of few programs (B *
# Hkv just above a multiple of R * #SMs: 396 for 12/12, 528 for 32/8 and 12/2 on the H200), and batches with a fuller
# last wave: the single pass against the planned path
CLIFF_ROWS = [
    Row([1024] * 66, 12, 12), Row([1024] * 68, 12, 12), Row([1024] * 76, 12, 12), Row([1024] * 84, 12, 12),
    Row([1024] * 92, 12, 12), Row([4096] * 34, 12, 12), Row([4096] * 40, 12, 12), Row([4096] * 50, 12, 12),
    Row([4096] * 68, 32, 8), Row([4096] * 80, 32, 8), Row([4096] * 100, 32, 8), Row([1024] * 140, 32, 8),
    Row([1024] * 160, 32, 8), Row([256] * 280, 12, 2), Row([2048] * 34, 32, 32), Row([2048] * 40, 32, 32),
]  # fmt: skip
# the second cliff probe: last waves of a third to a half, two full waves, short and long sequences
CLIFF2_ROWS = [
    Row([4096] * 45, 12, 12), Row([4096] * 88, 32, 8), Row([4096] * 68, 12, 12), Row([4096] * 136, 32, 8),
    Row([2048] * 150, 32, 8), Row([1024] * 34, 12, 12), Row([1024] * 68, 32, 8), Row([512] * 34, 12, 12),
    Row([8192] * 34, 12, 12), Row([2048] * 40, 12, 12), Row([2048] * 76, 32, 8), Row([16384] * 36, 12, 12),
    Row([4096] * 34, 12, 12), Row([4096] * 80, 32, 8),
]  # fmt: skip
CLIFF_VARIANTS = [("single", dict(), "single"), ("planned", dict(), "planned"), ("single_again", dict(), "single")]
# `perf_probe.py gate`: the dual path's length gate in that range (single_pass_tail): even long, even short and
# uneven batches, the dual-path call against both paths alone
GATE_ROWS = [
    Row([4096] * 34, 12, 12), Row([4096] * 80, 32, 8), Row([4096] * 45, 12, 12), Row([16384] * 36, 12, 12),
    Row([2048] * 76, 32, 8), Row([512] * 34, 12, 12), Row([1000] * 34, 12, 12), Row([768] * 68, 32, 8),
    Row([512 + i * 229 % 7680 for i in range(34)], 12, 12), Row([65536] + [1024] * 79, 32, 8),
    Row([1024] * 64, 12, 12),
]  # fmt: skip
# `perf_probe.py gate2`: the same range for the tile classes the gate leaves out: "small_group" (32/32, 16/16: a split
# target of 4, the single pass's MHA tile fits 3 per SM) and head dim 256
GATE2_ROWS = [
    Row([4096] * 13, 32, 32), Row([4096] * 16, 32, 32), Row([4096] * 17, 32, 32), Row([2048] * 26, 16, 16),
    Row([4096] * 34, 32, 8, 256), Row([4096] * 40, 32, 8, 256), Row([1024] * 13, 32, 32),
]  # fmt: skip
# `perf_probe.py scan`: uniform batches across B for three head configurations, through auto's rule boundaries
# (planned, dual path, tail gate, single pass): time per sequence should not step with B
SCAN_ROWS = (
    [Row([4096] * b, 12, 12) for b in range(8, 72, 4)] + [Row([4096] * b, 32, 8) for b in range(16, 164, 8)]
    + [Row([1024] * b, 12, 2) for b in (64, 128, 192, 256, 272, 320, 368, 400)]
)
SCAN_VARIANTS = [("auto", dict(), "auto"), ("single", dict(), "single")]
# `perf_probe.py low`: auto's dual path from 1.75 instead of 2 single-pass programs per SM (1.7-1.94 per SM here)
LOW_ROWS = [
    Row([1024] * 128, 12, 2), Row([1024] * 120, 12, 2), Row([4096] * 20, 12, 12), Row([4096] * 30, 32, 8),
    Row([512] * 112, 12, 2), Row([2048] * 116, 12, 2), Row([4096] * 19, 12, 12),
    Row([300 + i * 53 % 1500 for i in range(128)], 12, 2),
]  # fmt: skip
LOW_VARIANTS = [("auto", dict(), "auto"), ("auto_175", dict(DUAL_PATH_MIN_PROGRAMS_PER_SM=1.75), "auto"),
                ("single", dict(), "single"), ("auto_again", dict(), "auto"),
                ("auto_175_again", dict(DUAL_PATH_MIN_PROGRAMS_PER_SM=1.75), "auto")]
# `perf_probe.py overhead`: the cost model's per-chunk fixed cost (CHUNK_OVERHEAD_TOKENS) on the rows auto plans
OVERHEAD_ROWS = [
    Row([4096] * 16, 12, 12), Row([16384] * 4, 12, 12), Row([65536], 12, 12), Row([1024] * 64, 12, 2),
    Row([4096] * 16, 12, 2), Row([16384] * 4, 12, 2), Row([65536], 12, 2), Row([131072], 12, 2), Row([8192], 32, 32),
    Row([32768], 32, 32), Row([2048], 28, 4), Row([2048] * 8, 28, 4), Row([131072] + [1024] * 63, 32, 8),
    Row([512] * 112, 12, 2), Row([1024] * 128, 12, 2), Row([512] * 30, 32, 8), Row([4096] * 24, 32, 8),
    Row([1024] * 16, 32, 8), Row([700] * 60, 12, 2),
]  # fmt: skip
OVERHEAD_VARIANTS = [("auto", dict(), "auto")] + [
    (f"ovh{t}", dict(CHUNK_OVERHEAD_TOKENS=t), "auto") for t in (64, 128, 256)
] + [("auto_again", dict(), "auto")]
# `perf_probe.py slots`: more chunk slots in the planned grid (EXTRA_PROGRAMS_PER_SM 8 -> 12, 16), so that the
# planner may cut the tail gate's long rows finer; rows whose cut does not change as controls
SLOTS_ROWS = [
    Row([4096] * 34, 12, 12), Row([4096] * 36, 12, 12), Row([4096] * 40, 12, 12), Row([16384] * 36, 12, 12),
    Row([4096] * 72, 32, 8), Row([4096] * 80, 32, 8), Row([2048] * 76, 32, 8), Row([1024] * 272, 12, 2),
    Row([2048] * 8, 28, 4), Row([1024] * 64, 12, 2), Row([4096] * 16, 12, 12), Row([131072] + [1024] * 63, 32, 8),
    Row([4096] * 24, 32, 8), Row([256] * 256, 12, 2),
]  # fmt: skip
SLOTS_VARIANTS = [("auto", dict(), "auto"), ("slots12", dict(EXTRA_PROGRAMS_PER_SM=12), "auto"),
                  ("slots16", dict(EXTRA_PROGRAMS_PER_SM=16), "auto"), ("auto_again", dict(), "auto")]
# `perf_probe.py wider`: 1.5-1.7 waves, past the gate's range: would the gate's 16 extra slots make the planned
# path win there (the 12/12 rows get 4 chunks a sequence with them)?
WIDER_ROWS = [Row([4096] * 50, 12, 12), Row([4096] * 55, 12, 12), Row([16384] * 50, 12, 12), Row([4096] * 100, 32, 8)]
WIDER_VARIANTS = [("single", dict(), "single"), ("planned", dict(), "planned"),
                  ("planned16", dict(EXTRA_PROGRAMS_PER_SM=16), "planned"), ("single_again", dict(), "single")]
# `perf_probe.py split`: the tail gate's split of an even long batch (TAIL_SPLIT) after 1, 2 or 3 full waves, last
# waves filled 0.03 to 0.6, against the single pass and the gate without the split (planned path for 1-1.4 waves,
# single pass above); "wide" lets the gate take last waves up to 0.7 (batches of 4096 tokens and more; at c37f794,
# up to 0.7 for every length and class). Short, uneven and anchor rows as controls
SPLIT_ROWS = [
    Row([4096] * 34, 12, 12), Row([4096] * 40, 12, 12), Row([4096] * 46, 12, 12), Row([4096] * 50, 12, 12),
    Row([4096] * 53, 12, 12), Row([4096] * 68, 12, 12), Row([4096] * 75, 12, 12), Row([4096] * 80, 12, 12),
    Row([4096] * 101, 12, 12), Row([1024] * 68, 12, 12), Row([16384] * 36, 12, 12), Row([4096] * 72, 32, 8),
    Row([4096] * 80, 32, 8), Row([4096] * 92, 32, 8), Row([4096] * 100, 32, 8), Row([4096] * 136, 32, 8),
    Row([4096] * 144, 32, 8), Row([4096] * 160, 32, 8), Row([2048] * 140, 32, 8), Row([1024] * 272, 12, 2),
    Row([1024] * 320, 12, 2), Row([1024] * 368, 12, 2), Row([4096] * 13, 32, 32), Row([4096] * 16, 32, 32),
    Row([4096] * 34, 32, 8, 256), Row([4096] * 40, 32, 8, 256), Row([512] * 34, 12, 12), Row([768] * 68, 32, 8),
    Row([512 + i * 229 % 7680 for i in range(34)], 12, 12), Row([65536] + [1024] * 79, 32, 8),
    Row([1024] * 64, 12, 12), Row([4096] * 64, 32, 8), Row([1024] * 400, 12, 2), Row([4096] * 48, 12, 12),
    Row([4096] * 96, 32, 8),
]  # fmt: skip
SPLIT_VARIANTS = [
    ("single", dict(), "single"), ("nosplit", dict(TAIL_SPLIT=False), "auto"), ("auto", dict(), "auto"),
    ("wide", dict(TAIL_FULLER={"mha": 1.7, "grouped": 1.7}), "auto"),
    ("auto_again", dict(), "auto"),
]
# `perf_probe.py small`: uniform batches of 0.5-2 single-pass programs per SM (auto plans them; the scan shows
# 15-25% more time per sequence than at full grids): the planner's cut against fixed splits of 2-16 and the single pass
SMALL_ROWS = [
    Row([4096] * 24, 32, 8), Row([4096] * 16, 32, 8), Row([4096] * 20, 12, 12), Row([4096] * 12, 12, 12),
    Row([4096] * 8, 12, 12), Row([4096] * 16, 12, 12), Row([1024] * 128, 12, 2), Row([2048] * 24, 32, 8),
]  # fmt: skip
SMALL_VARIANTS = [("rule", dict(), "planned"), ("fixed", dict(), "fixed"), ("single", dict(), "single"),
                  ("rule_again", dict(), "planned")]
# `perf_probe.py fusedtile`: the fused merge's planned calls with the prefetching 32-token tile (FUSED_PREFETCH at
# 3ad0ec6: slower, removed), without the heads-first grid, or with the combine launch: which of the three made fixed
# splits 10-14% faster on the grouped rows of `small` (24 x 4096 32/8 rule 112.8, fixed2 99.8, same 384 programs)
FUSEDTILE_ROWS = [
    Row([4096] * 24, 32, 8), Row([2048] * 24, 32, 8), Row([4096] * 16, 32, 8), Row([4096] * 32, 32, 8),
    Row([2048] * 40, 32, 8), Row([4096] * 64, 32, 8), Row([256] * 256, 12, 2), Row([1024] * 64, 12, 2),
    Row([131072] + [1024] * 63, 32, 8), Row([2048 + i * 1237 % 3829 for i in range(32)], 32, 8),
    Row([4096] * 20, 28, 4), Row([4096] * 12, 12, 12), Row([4096] * 80, 32, 8),
]  # fmt: skip
FUSEDTILE_VARIANTS = [
    ("rule", dict(), "planned"), 
    ("rows_first", dict(PARTIAL_HEADS_FIRST=("deep",)), "planned"), ("combine", dict(FUSED_COMBINE=False), "planned"),
    ("fixed", dict(), "fixed"), ("auto", dict(), "auto"),
    ("rule_again", dict(), "planned"),
]
# `perf_probe.py idle`: neither the tile, the grid order nor the merge explained the planned path's 12-27% over fixed
# splits and the single pass on the grouped rows (probe fusedtile at 3ad0ec6: 40 x 2048 32/8 planned 108.8, single
# pass 89.4, same 320 programs); the planned grid's unused chunk slots (EXTRA_PROGRAMS_PER_SM per SM) and PDL
IDLE_ROWS = [
    Row([2048] * 40, 32, 8), Row([4096] * 24, 32, 8), Row([2048] * 24, 32, 8), Row([4096] * 20, 28, 4),
    Row([4096] * 64, 32, 8), Row([131072] + [1024] * 63, 32, 8), Row([4096] * 12, 12, 12), Row([1024] * 64, 12, 2),
]  # fmt: skip
IDLE_VARIANTS = [
    ("rule", dict(), "planned"), ("slots2", dict(EXTRA_PROGRAMS_PER_SM=2), "planned"),
    ("slots4", dict(EXTRA_PROGRAMS_PER_SM=4), "planned"), ("nopdl", dict(PDL=False), "planned"),
    ("single", dict(), "single"), ("rule_again", dict(), "planned"),
]
# `perf_probe.py hint`: the partial kernel told that chunk starts are multiples of BLOCK_N (ALIGNED_HINT, at e612171:
# the same PTX, the same times; removed)
HINT_ROWS = IDLE_ROWS + [
    Row([2048] * 8, 28, 4), Row([2048], 28, 4), Row([65536], 12, 2), Row([16384] * 4, 12, 12), Row([4096] * 16, 12, 12),
    Row([4096] * 16, 12, 2), Row([256] * 256, 12, 2), Row([4096] * 34, 12, 12),
]  # fmt: skip
HINT_VARIANTS = [
    ("hint", dict(), "planned"), ("fixed", dict(), "fixed"), ("single", dict(), "single"), ("auto", dict(), "auto"),
]
# `perf_probe.py fixedall`: fixed splits (S up to 512) against auto on the rows auto plans, B = 1 included: the
# fixed-split partial kernel (73-75 registers, 6 programs per SM) beat the planned one (94-108, 4) by 3-16% on
# uniform rows (probe hint at e612171)
FIXEDALL_ROWS = [
    Row([65536], 12, 12), Row([131072], 12, 12), Row([16384] * 4, 12, 12), Row([4096] * 16, 12, 12),
    Row([65536], 12, 2), Row([131072], 12, 2), Row([16384] * 4, 12, 2), Row([4096] * 16, 12, 2),
    Row([1024] * 64, 12, 2), Row([8192], 32, 32), Row([32768], 32, 32), Row([131072], 32, 32), Row([2048], 28, 4),
    Row([2048] * 8, 28, 4), Row([4096] * 24, 32, 8), Row([4096] * 20, 28, 4), Row([128], 28, 4),
]  # fmt: skip
# `perf_probe.py grid`: what in the planned call's launch costs it against fixed splits of the same cut (S = the
# planner's chunks per sequence of a uniform batch): the planned grid sized exactly (no idle slots), the fixed mode
# with the planned grid's idle slots (FIXED_GRID_SLOTS) and heads-first order (FIXED_HEADS_FIRST)
GRID_ROWS = [
    Row([2048] * 40, 32, 8), Row([4096] * 24, 32, 8), Row([2048] * 8, 28, 4), Row([4096] * 16, 12, 2),
    Row([16384] * 4, 12, 12), Row([1024] * 64, 12, 2), Row([4096] * 20, 28, 4), Row([32768], 32, 32),
]  # fmt: skip
GRID_VARIANTS = [
    ("rule", dict(), "planned"), ("exact", dict(), "exact"), ("fixedP", dict(), "fixedP"),
    ("fixedP_pad", dict(), "fixedP_pad"), ("fixedP_hf", dict(FIXED_HEADS_FIRST=True), "fixedP"),
    ("fixedP_pad_hf", dict(FIXED_HEADS_FIRST=True), "fixedP_pad"), ("single", dict(), "single"),
    ("rule_again", dict(), "planned"),
]
# `perf_probe.py grid2`: how many trailing idle CTAs cost what (fixed splits, heads-first, padded to 4 or 8 programs
# per SM or to the planned grid's slots)
GRID2_ROWS = GRID_ROWS[:5]
GRID2_VARIANTS = [
    ("fixedP_hf", dict(FIXED_HEADS_FIRST=True), "fixedP"), ("cap4", dict(FIXED_HEADS_FIRST=True), "fixedP_cap4"),
    ("cap8", dict(FIXED_HEADS_FIRST=True), "fixedP_cap8"), ("pad", dict(FIXED_HEADS_FIRST=True), "fixedP_pad"),
    ("rule", dict(), "planned"), ("exact", dict(), "exact"),
    ("fixedP_hf_again", dict(FIXED_HEADS_FIRST=True), "fixedP"),
]
# `perf_probe.py store`: the anchor grid's rows through auto, for an A/B of a kernel change run twice
STORE_ROWS = [
    Row([1024] * 64, 12, 12), Row([256] * 256, 12, 12), Row([4096] * 16, 12, 12), Row([65536], 12, 12),
    Row([256] * 256, 12, 2), Row([1024] * 64, 12, 2), Row([65536], 12, 2), Row([8192], 32, 32), Row([128], 28, 4),
    Row([2048], 28, 4), Row([128] * 8, 28, 4), Row([2048] * 8, 28, 4), Row([4096] * 64, 32, 8),
    Row([2048] * 256, 32, 8), Row([131072] + [1024] * 63, 32, 8), Row([3064] * 64, 32, 8),
    Row([4096] * 64, 32, 8, 256), Row([4096] * 64, 32, 8, 64),
]  # fmt: skip
STORE_VARIANTS = [("auto", dict(), "auto"), ("auto_again", dict(), "auto")]
# `perf_probe.py direct`: planned calls without the fused merge leave single-chunk sequences to the combine
# (DIRECT_SINGLE_CHUNKS False at f45ad2a: 72 registers instead of 96, but slower on every row: removed; kept as auto
# vs fixed)
DIRECT_ROWS = [
    Row([65536], 12, 2), Row([131072], 12, 2), Row([16384] * 4, 12, 2), Row([4096] * 16, 12, 2), Row([2048], 28, 4),
    Row([2048] * 8, 28, 4), Row([4096] * 20, 28, 4), Row([8192] * 5, 28, 4), Row([1024] * 16, 32, 8),
    Row([65536], 12, 12), Row([8192], 32, 32), Row([4096] * 24, 32, 8),
    Row([300 + i * 977 % 4000 for i in range(12)], 12, 2),
]  # fmt: skip
DIRECT_VARIANTS = [("auto", dict(), "auto"), 
                   ("fixed", dict(), "fixed"), ("auto_again", dict(), "auto")]
FIXEDALL_VARIANTS = [("auto", dict(), "auto"), ("fixed", dict(), "fixed"), ("auto_again", dict(), "auto")]
GATE_VARIANTS = [("single", dict(), "single"), ("planned", dict(), "planned"), ("dual", dict(), "dual"),
                 ("dual_again", dict(), "dual")]
THRESHOLD_VARIANTS = [("rule", dict(), "planned"), ("single", dict(), "single"), ("dual", dict(), "dual")]
# (name, module attributes to set, mode); the first is the baseline. mode: "planned" (decode_splitk as auto calls
# it), "fixed" (num_splits S for each S with 1.5-9 programs per SM: no planner, a combine launch), "single"
VARIANTS = [
    ("rule", dict(), "planned"),
    ("planner_combine", dict(FUSED_COMBINE=False), "planned"),
    ("inline_combine", dict(FUSED_COMBINE=False, INLINE_PLAN_MAX_BATCH=256), "planned"),
    ("single", dict(), "single"),
    ("rule_again", dict(), "planned"),
]
# the single pass only where its grid is at least one program per SM and no sequence is long
SINGLE_ROWS = {"256x256 12/2", "16x4096 12/12", "64x3064 32/8", "64x4096 32/8", "64x1024 12/2", "16x1024 32/8"}
API_DUAL_MIN = api.DUAL_PATH_MIN_PROGRAMS_PER_SM
# variants whose per-kernel GPU time goes to profile.txt
PROFILED = ("rule", "fixed16", "hint", "nohint")
DEFAULTS = {k: getattr(triton_splitk, k) for k in
            ("COMBINE_WIDE", "SMALL_GROUP_SPLIT_TILE", "SATURATION_PER_SM", "FUSED_COMBINE", "MERGE_UNROLL",
             "INLINE_PLAN_MAX_BATCH", "FUSED_EXPECTED_CHUNKS", "PARTIAL_HEADS_FIRST", "PLANNER_SATURATION",
             "EXTRA_PROGRAMS_PER_SM", "COMBINE_BLOCK_S", "WAVE_SATURATION", "CHUNK_OVERHEAD_TOKENS", "TAIL_SPLIT",
             "TAIL_WAVES", "TAIL_FULLER", "grid_chunks", "FIXED_GRID_SLOTS", "FIXED_HEADS_FIRST")}


def set_variant(attrs):
    for k, v in DEFAULTS.items():
        setattr(triton_splitk, k, v)
    triton_common.PDL = True
    api.DUAL_PATH_MIN_PROGRAMS_PER_SM = API_DUAL_MIN
    for k, v in attrs.items():
        setattr(triton_common if k == "PDL" else (api if k.startswith("DUAL_PATH") else triton_splitk), k, v)
    # recorded calls hold the constants they were recorded under, and the tail lookup its answers
    launcher.clear()
    triton_splitk.single_pass_tail.cache_clear()


def planned_cut(row, sms):
    """(chunks per sequence, chunk slots) of the planned call on a uniform row, as decode_splitk cuts it."""
    fused = triton_splitk.merge_in_partial(row.batch, 1, row.num_q_heads, row.num_kv_heads, sms)
    cfg, saturation, _ = triton_splitk.split_config(
        row.head_dim, row.num_q_heads // row.num_kv_heads, torch.bfloat16, 1, 2, row.num_kv_heads, fused
    )  # fmt: skip
    slots = triton_splitk.grid_chunks(row.batch, row.num_kv_heads, sms)
    cand = triton_splitk.num_candidates(max(row.seqlens), cfg["BLOCK_N"])
    plan = triton_splitk.chunk_plan(
        row.seqlens, row.num_kv_heads, sms, slots, cfg["BLOCK_N"], cand, saturation=saturation
    )  # fmt: skip
    assert len(set(row.seqlens)) == 1 and len(plan) % row.batch == 0, "uniform rows only"
    return len(plan) // row.batch, slots


def profile_row(row, fn, log):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    log.write(f"== {row.name()} (20 calls)\n")
    log.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8) + "\n")
    log.flush()


# mode (the command-line argument) -> (rows, variants); "" is the default
MODES = {
    "": (ROWS, VARIANTS), "deep": (DEEP_ROWS, VARIANTS), "fused": (FUSED_ROWS, VARIANTS),
    "dual": (DUAL_ROWS, DUAL_VARIANTS), "waves": (WAVES_ROWS, WAVES_VARIANTS),
    "threshold": (THRESHOLD_ROWS, THRESHOLD_VARIANTS), "quant": (QUANT_ROWS, QUANT_VARIANTS),
    "cliff": (CLIFF_ROWS, CLIFF_VARIANTS), "cliff2": (CLIFF2_ROWS, CLIFF_VARIANTS), "gate": (GATE_ROWS, GATE_VARIANTS),
    "gate2": (GATE2_ROWS, GATE_VARIANTS), "scan": (SCAN_ROWS, SCAN_VARIANTS), "low": (LOW_ROWS, LOW_VARIANTS),
    "overhead": (OVERHEAD_ROWS, OVERHEAD_VARIANTS), "slots": (SLOTS_ROWS, SLOTS_VARIANTS),
    "wider": (WIDER_ROWS, WIDER_VARIANTS), "split": (SPLIT_ROWS, SPLIT_VARIANTS),
    "small": (SMALL_ROWS, SMALL_VARIANTS), "fusedtile": (FUSEDTILE_ROWS, FUSEDTILE_VARIANTS),
    "idle": (IDLE_ROWS, IDLE_VARIANTS), "hint": (HINT_ROWS, HINT_VARIANTS),
    "fixedall": (FIXEDALL_ROWS, FIXEDALL_VARIANTS), "store": (STORE_ROWS, STORE_VARIANTS),
    "direct": (DIRECT_ROWS, DIRECT_VARIANTS), "grid": (GRID_ROWS, GRID_VARIANTS),
    "grid2": (GRID2_ROWS, GRID2_VARIANTS),
}  # fmt: skip
# the modes whose "single" variants run on every row (the others: only on SINGLE_ROWS)
SINGLE_ON_SOME_ROWS = ("", "fused")


def main():
    mode_name = " ".join(sys.argv[1:])
    if mode_name not in MODES:
        sys.exit(f"perf_probe.py: unknown mode {mode_name!r}; modes: {', '.join(repr(m) for m in MODES)}")
    rows, variants = MODES[mode_name]
    out_dir = os.environ.get("OUT", ".")
    log = ProbeLog("probe")
    prof_log = open(os.path.join(out_dir, "profile.txt"), "w")
    l2 = _l2_bytes("cuda")
    for row in rows:
        c = random_paged_case(
            row.seqlens, row.num_q_heads, row.num_kv_heads, row.head_dim, 16, torch.bfloat16, "cuda", spare_pages=0
        )  # fmt: skip
        scale = row.head_dim**-0.5
        ref, _ = reference_dense(*c.args, device="cuda")
        copies = rotation_copies(c, l2)
        results = []
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        runs = []
        single_everywhere = mode_name not in SINGLE_ON_SOME_ROWS
        for name, attrs, mode in variants:
            if mode == "fixed":
                pairs = row.batch * row.num_kv_heads
                runs += [(f"fixed{s}", attrs, s) for s in (2, 4, 8, 16, 32, 64, 128, 256, 512)
                         if 1.5 * sms <= pairs * s <= 9 * sms]
            elif mode != "single" or single_everywhere or row.name() in SINGLE_ROWS:
                runs.append((name, attrs, mode))
        for name, attrs, mode in runs:
            set_variant(attrs)
            if mode in ("exact", "fixedP", "fixedP_pad", "fixedP_cap4", "fixedP_cap8"):
                if len(set(row.seqlens)) > 1:
                    continue
                per_seq, slots = planned_cut(row, sms)
                if mode == "exact":
                    triton_splitk.grid_chunks = lambda *a, n=per_seq * row.batch, **k: n
                    mode = "planned"
                else:
                    if mode == "fixedP_pad":
                        triton_splitk.FIXED_GRID_SLOTS = slots
                    elif mode.startswith("fixedP_cap"):
                        triton_splitk.FIXED_GRID_SLOTS = -(-int(mode[-1]) * sms // row.num_kv_heads)
                    mode = per_seq
            it = itertools.cycle(copies)
            # NaN: a variant that writes nothing fails the check below
            out = torch.full_like(c.q, float("nan"))

            def fn():
                if mode == "auto":
                    return decode_attention(*next(it).args, softmax_scale=scale, out=out), None
                if mode in ("single", "single_even"):
                    # single_even: the dual-path call's single pass alone (its evenness test, no planned kernels)
                    return decode_single(*next(it).args, scale, out, None, num_sms=sms, even_only=mode == "single_even")
                splits = None if mode in ("planned", "dual") else mode
                return triton_splitk.decode_splitk(
                    *next(it).args, scale, out, None, num_splits=splits, dual_path=mode == "dual"
                )  # fmt: skip

            try:
                err = max_err(fn()[0], ref)
                assert err < 0.05, f"wrong: err {err}"
                us = do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
            except Exception as e:  # noqa: BLE001 - a failing variant is reported, the sweep goes on
                print(f"{row.name()} {name} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            rec = dict(row=row.name(), variant=name, us=round(us, 2),
                       gbps=round(row.io_bytes() / us / 1e3))  # fmt: skip
            log.record(rec)
            results.append(rec)
            if name in PROFILED:
                profile_row(row, fn, prof_log)
        log.line(f"{row.name():<22}" + "  ".join(f"{r['variant']} {r['us']:.1f}" for r in results))
    set_variant({})
    prof_log.close()
    log.close()


def plot_scan(jsonl, png):
    """µs per sequence against B for each head configuration of a scan's probe.jsonl, auto and single pass."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [json.loads(line) for line in open(jsonl)]
    configs = sorted({r["row"].split(" ", 1)[1] + " x " + r["row"].split("x")[1].split(" ")[0] for r in recs})
    fig, axes = plt.subplots(1, len(configs), figsize=(5 * len(configs), 4), squeeze=False)
    for ax, config in zip(axes[0], configs):
        heads, tokens = config.split(" x ")
        for variant, style in (("auto", "o-"), ("single", "x--")):
            pts = sorted((int(r["row"].split("x")[0]), r["us"]) for r in recs
                         if r["variant"] == variant and r["row"].endswith(heads) and f"x{tokens} " in r["row"])
            ax.plot([b for b, _ in pts], [us / b for b, us in pts], style, label=variant, ms=4)
        ax.set_title(f"{tokens} tokens, {heads} heads")
        ax.set_xlabel("batch B")
        ax.set_ylabel("µs per sequence (CUDA graph)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    if sys.argv[1:2] == ["scan-plot"]:
        plot_scan(sys.argv[2], sys.argv[3])
    else:
        main()
