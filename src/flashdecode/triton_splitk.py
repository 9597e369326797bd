"""Split-K paged decode attention (flash-decoding): partial kernel + LSE combine kernel, planned on the device.

The work is cut into *chunks*: contiguous token ranges of one sequence, on BLOCK_N-tile edges. The partial kernel,
one program per (chunk, KV head), runs the online softmax over its chunk for the whole GQA group and writes the
normalised partial output o_c = acc_c / l_c (fp32) and its natural-log LSE lse_c = m_c + log(l_c). The combine
kernel, one program per (query head, sequence), merges the sequence's chunks:

    LSE = log(sum_c exp(lse_c)),    out = sum_c exp(lse_c - LSE) * o_c

Each partial is weighted exactly once by its softmax mass exp(lse_c) = l_c * exp(m_c). (The combine published with
the source blog post stores acc_c unnormalised and multiplies by l_c again, weighting each chunk by l_c twice.)

Two ways to cut, one kernel:

* planned (``num_splits=None``): a one-launch planner kernel reads the B lengths and writes the cut: one chunk size C
  for the batch, picked from BLOCK_N * 2^k by a cost model of waves per SM (``_chunk_layout``); sequence b gets
  max(ceil(L_b / C), 1) chunks (an empty one: one empty chunk), numbered consecutively (a prefix sum), and, for an
  uneven batch, dispatched longest first (``dispatch_chunks``: every full chunk, then the last ones). A long
  sequence among short ones gets many chunks, the short ones one each, and a batch that already fills the GPU keeps
  one chunk per sequence. The grid has ``grid_chunks`` = B + a few programs per SM slots: sized from B and the SM
  count, never from the cache's capacity, read by no host code, so one CUDA graph serves every length. A sequence
  that gets a single chunk is written straight to the output by its partial program; the combine skips it. Batches of
  <= 16 sequences compute the same cut inside each program instead (``inline_chunk``, no planner launch; with the
  fused merge a one-program kernel zeroes its counters, ``INLINE_FUSED_MAX_BATCH``).
* merging: with B * q_len * Hq >= #SMs the last chunk program of a sequence to finish merges its chunks
  (``merge_if_last``: an acq_rel arrival counter the planner, or that kernel, zeroed); otherwise, or for sequences of
  more than FUSED_MAX_CHUNKS chunks, the combine kernel does (then with programs for the few sequences that can have
  that many, ``COMBINE_LONG_ONLY``).
* dual path (``dual_path=True``, what ``auto`` uses at 2 to 4 single-pass programs per SM): the single pass is
  launched first and writes only if the lengths are even (the longest at most 1.5 times the mean,
  ``triton_common.even_batch``); the planned kernels after it take the same test and return on an even batch.
  Where the single pass would end on a nearly empty wave (``single_pass_tail``: full waves of programs and a last
  one filled to a fraction), it runs alone only for an even batch of short sequences (mean below TAIL_LONG_TOKENS);
  an even batch of longer ones is split, the single pass writing the full waves' sequences and the planned kernels
  the rest, and the planned grid gets more chunk slots. A full grid's dual path (``full_grid_span``) takes the test
  over a wave's sequences: the single pass keeps every batch whose longest sequence fits a wave slot's share.
* fixed (``num_splits=S``): each sequence's T tiles are dealt to S pieces, split s taking tiles
  [s * T / S, (s + 1) * T / S) (sizes differ by at most one tile; some may be empty: they write (0, -inf)); chunk
  b * S + s is split s of sequence b. Grid (B * S, Hkv).
* deterministic (``split_tokens=T``): the fixed mode with split s of every sequence covering tokens
  [s * T, (s + 1) * T) of its visible range: boundaries depend on the sequence's own length only, and
  S = ceil(table capacity / T) slots per sequence (the empty ones add exact zeros in the combine, whose blocks and
  order never change), so a sequence's output is bit-identical whatever else is in the batch. The grid is sized
  from the table's capacity: the price of the guarantee (docs/design.md).

Bytes: the visible K/V once per head block (one block unless q_len x group exceeds BLOCK_H), plus
2 * chunks * q_len * Hq * (D + 1) * 4 for the fp32 partials of multi-chunk sequences. With a sliding window both
modes cut only the visible tokens [window start, L), so pages before the window are never read.
Grids: planner (slots / ``planner_shape``); partial (slots, Hkv * head blocks), or in planned mode (Hkv * head
blocks, slots) for the tile classes of ``PARTIAL_HEADS_FIRST`` (q_len x group >= 4, head dims above 128, fp8's long
tile); combine (q_len * Hq,
B, head-dim blocks), not launched when the merge is fused and the table cannot hold a longer sequence.
"""

from __future__ import annotations

import collections
import functools
import math

import torch
import triton
import triton.language as tl

from .api import v_token_major
from .launcher import launch, workspace
from .triton_common import (
    LOG2E,
    FP8_LONG_TILE,
    PREFETCH_TILE_PER_SM,
    Features,
    attend_group,
    bucket_order,
    bucket_ranks,
    cache_offsets_fit_int32,
    cdiv,
    chain_pdl,
    dot_in_fp32,
    even_lengths,
    even_test,
    first_page_ids,
    group_rows,
    launch_config,
    let_next_start,
    next_power_of_2,
    pages_before_lengths,
    planned_from,
    store_group,
    tile_programs_per_sm,
    use_pdl,
    uses_prefetch_tile,
    uses_tile,
    visible_lengths,
    wait_for_previous,
    window_start,
    window_starts,
)
from .triton_single import as_rows, decode_single

__all__ = [
    "decode_splitk", "split_config", "grid_chunks", "fixed_split_count", "num_candidates", "split_bounds", "chunk_size",
    "chunk_plan", "host_cut", "host_table", "splitk_partials_mirror", "capacity_splits",
]  # fmt: skip

# planner cost model (see _chunk_layout): an SM needs this many programs to reach its share of the bandwidth (the
# default, and the scale of the grid and of the merge rule; the planner's own target comes from PLANNER_SATURATION)...
SATURATION_PER_SM = 4
# ...by partial tile class (split_config): at most what fits an SM ("deep": head dims above 128; "fp8_long": an fp8
# cache's FP8_LONG_TILE; the long tiles MHA_LONG_TILE 3, GROUPED_LONG_TILE 1, GROUPED_MID_TILE 2), as measured.
# None: SATURATION_PER_SM for every tile (docs/design.md, "Why these choices")
PLANNER_SATURATION = dict(mha=3, small_group=4, grouped=4, deep=2, fp8_long=2, mha_long=3, grouped_long=1,
                          grouped_mid=2)
# ...and each program costs this many tokens' worth of time beyond its tokens (setup, partial write, combine read);
# 64, not 32: fewer, longer chunks where they pay (docs/design.md, "Why these choices")
CHUNK_OVERHEAD_TOKENS = 64
# chunk slots in the grid beyond one per sequence, in programs per SM (the planner never uses more). Fewer (6, 5, 4 or
# the tile's target) were measured and not kept: probe 1294503, docs/design.md
EXTRA_PROGRAMS_PER_SM = 2 * SATURATION_PER_SM
# ...and in a dual-path call under the tail gate (single_pass_tail), whose planned path takes batches of more than a
# wave of long sequences: room for the planner to cut them finer; only there, since the in-place rows lose with it
# (docs/design.md, "Single-pass tails")
TAIL_EXTRA_PROGRAMS_PER_SM = 4 * SATURATION_PER_SM
# the planner keeps every length in registers ([64 slots x B] tiles); above this batch the single-pass grid is full
MAX_PLANNED_BATCH = 512
# the planner dispatches an uneven batch's chunks longest first (``dispatch_chunks``). False: in sequence order.
# H200 (scripts/order_probe.py --variants planner at ef2f631, `auto`, graph µs): long tails 120 x 256..2048 + 8 x
# 16k..32k 32/8 389.4 -> 324.0, 240 x ... + 16 x ... 12/2 205.0 -> 182.1; ragged 192.3 -> 193.7 (the planner's cost)
PLANNER_ORDER = True
# ...and deals each uneven batch's sequence tiles evenly to its chunks (``chunk_bounds``). False: chunks of the planned
# size and a shorter last one. Same probe, with the order: 48 x 256..16000 32/8 426.1 -> 374.0, 200 x 100..8000 12/2
# 222.2 -> 199.6; the long tails 1-2.5% slower (docs/design.md, "The device planner's order and equal chunks")
PLANNER_EQUAL = True
# in-place plans in (chunk slots, heads) grids: a chunk slot past the most chunks the lengths allow (``most_chunks``)
# returns before the cut (heads-first grids dispatch their unused slots last)
INLINE_EXIT = True
# the combine kernel reads the chunks' LSEs in blocks of this many
COMBINE_BLOCK_S = 64
# ...and after an in-place plan (at most 16 sequences, many (sequence, row) pairs), a sequence of at most this many
# chunks in one block of this many (0: off)
COMBINE_INLINE_SMALL_S = 16
# planned calls with the fused merge launch the combine for the sequences of more than FUSED_MAX_CHUNKS chunks only:
# one program per row for each sequence that can have that many, not per sequence, so that few combine programs idle
# (launch_combine's long_only). False: one per sequence (docs/design.md, "Which one")
COMBINE_LONG_ONLY = True
# the combine splits the head dim over this many programs
COMBINE_D_BLOCKS = 1
# when B * Hq < #SMs (few (sequence, head) pairs, each merging many chunks) the combine instead reads
# COMBINE_WIDE = (chunks per block, head-dim blocks): one wide load instead of a chain of four dependent ones.
# H200, 12/2 rows: 1 x 65536 32.3 -> 27.8 us, 1 x 131072 49.3 -> 43.9 us; other rows unchanged (None: off)
COMBINE_WIDE = (256, 4)
# a COMBINE_WIDE tile [BLOCK_S, BLOCK_DC] of at most this many elements (fixed splits: BLOCK_S = S) is merged by one
# warp, not four: its reductions over the chunks then cross no warps (no barriers). 0: off
# (docs/design.md, "One warp for the wide shape's small tiles")
COMBINE_ONE_WARP_MAX = 4096
# partial tile for groups < 4 in split-K when a token row (Hkv * D * itemsize bytes) is a power of two; None: off.
# The rule is the measurement (other token rows lost, the mechanism is not established); two stages, not three
# (docs/design.md, "What each optimisation bought")
SMALL_GROUP_SPLIT_TILE = dict(BLOCK_N=64, num_stages=2)
# ...and the other groups < 4 (the "mha" tile class: 128 tokens, 2 stages) one stage deeper, for plan_decode's fixed
# splits of long MHA rows (tile class "mha_long"; the rule and what it bought: plan.MHA_LONG_MIN_TOKENS): the same
# 72 KB of shared memory and 3 programs per SM (152 registers against 121 on sm_90), a third tile of loads in flight.
# None: off
MHA_LONG_TILE = dict(BLOCK_N=128, num_stages=3)
# ...but one query row a KV head at head dim 128 (MHA, one token) takes the grouped prefetching tile instead (32 tokens,
# 3 stages, the page ids a tile ahead), still 3 programs per SM, from plan.MHA_PREFETCH_MIN_TOKENS; head dim 64 lost
# with it and keeps MHA_LONG_TILE. None: off (docs/design.md, "What each optimisation bought")
MHA_PREFETCH_TILE = dict(BLOCK_N=32, num_stages=3, PREFETCH_PAGES=True)
# ...and plan_decode's grouped fixed splits take 128 tokens at 3 stages (192 KB, one program per SM, merged in the last
# split program: "grouped_long", plan.GROUPED_LONG_MIN_TOKENS) or 64 at 3 (96 KB, two per SM, merged by the combine:
# "grouped_mid", plan.GROUPED_MID_MIN_FILL). None: off (docs/design.md, "Bytes in flight")
GROUPED_LONG_TILE = dict(BLOCK_N=128, num_stages=3)
GROUPED_MID_TILE = dict(BLOCK_N=64, num_stages=3)
# planned mode with B * q_len * Hq >= #SMs: a sequence of at most FUSED_MAX_CHUNKS chunks is merged by its last chunk
# program to finish (merge_if_last); the combine is launched only when the table could hold a longer one, and merges
# only those. Fewer (sequence, row) pairs keep the separate, wide combine. H200 (probe dbeb3c5, serial merge):
# 64 x 1024 12/2 32.7 -> 26.8 us, 256 x 256 12/2 32.0 -> 28.4 us. False: always the combine launch (measurements)
FUSED_COMBINE = True
FUSED_MAX_CHUNKS = 64
# ...and only when a uniform batch would get at most this many chunks per sequence: with more, the in-place plan (or
# the planner) and a combine launch win. H200 (probe 505aa6e, fused + planner -> combine launch, in place):
# 16 x 4096 12/2 28.1 -> 26.9 us, 8 x 2048 28/4 20.5 -> 18.8, 12 x 2048 12/2 23.1 -> 18.4, 5 x 8192 28/4
# 40.6 -> 35.6; but 16 x 1024 32/8 (4 chunks each) 26.6 -> 31.3
FUSED_EXPECTED_CHUNKS = 8
# fixed splits (plan_decode's, with the plan's counters: decode_splitk(counters=...)) merge in the last split program
# too when a sequence has at most this many splits and B * q_len * Hq >= #SMs: with more splits or fewer pairs the
# serial merge loses to the combine launch (docs/design.md, "Fixed splits merged in the last split program")
FIXED_MERGE_MAX_SPLITS = 4
# ...and fixed splits of the "mha" tile class (groups < 4 whose token row is not a power of two: 12/12, 40/40) merge
# there whatever the number of (sequence, row) pairs: a last program merges at most 3 rows. False: the pairs rule for
# every tile class (the small-group tile lost with it; docs/design.md, "What each optimisation bought")
FIXED_MERGE_MHA_ANY_PAIRS = True
# plan_decode's fixed splits of PREFETCH_TILE (32 tokens, groups of 4-16 at head dim 128) take at least this many tiles
# each: a cut into shorter chunks is halved while B * Hkv * head blocks * S/2 still gives every SM a program (the
# cut prices a half-full SM as a full one). 0: the cut's S (docs/design.md, "Short fixed splits lengthened")
FIXED_MIN_SPLIT_TILES = 4
# planned calls of at most this many sequences that do not fuse the merge compute the cut inside the partial and
# combine programs (``inline_chunk``) instead of launching the planner; 0: always the planner (measurements)
INLINE_PLAN_MAX_BATCH = 16
# planned calls of at most this many sequences that fuse the merge plan in place too, their merge counters zeroed by a
# one-program kernel (``launch_zero_counters``) instead of the planner. 0: the planner (measurements)
INLINE_FUSED_MAX_BATCH = 16
# chunks the merge loads per step (independent loads in flight: a serial merge cost ~0.27 us per chunk). The
# partial kernel runs 4 programs per SM only at <= 128 registers a thread (4 warps): unrolling by 4 took groups 6 and
# 7 from 126 to 136 registers (ptxas, sm_90a) and 256 x 256 12/2 from 28.4 to 34.5 us; by 2 they need 108
MERGE_UNROLL = 2
# fixed splits of at most this many merge in one unrolled step: ptxas issues all their loads at once (S 4: 12 loads,
# one L2 round trip). H200 (scripts/fused_fixed_probe.py, sweeps/merge-unroll): 64 x 1024 12/2 S 4 22.7 -> 22.3-22.4
# us, but S 8 26.1 -> 27.0-27.3 (there ptxas interleaves the loads with the math), S 16 25.3 -> 24.0 (not merged in
# the partial: the combine launch takes 22.8)
MERGE_UNROLL_ALL = tl.constexpr(4)
# tile classes (split_config) whose planned partial grid is (Hkv * head blocks, chunk slots): a chunk's KV heads are
# dispatched together, as in the single pass, and unused slots come last; the others, whose MHA rows lost with it,
# (chunk slots, heads). "deep" keeps the order of its groups >= 4 (docs/design.md, "How splits are chosen")
PARTIAL_HEADS_FIRST = ("grouped", "deep", "fp8_long")
# the cut's cost in waves of R resident programs (R = the planner's target), {R: programs that saturate an SM}: a
# partial last wave of fewer runs below the SM's bandwidth (``_chunk_layout``). None: the model without waves
# (docs/design.md, "Why these choices")
WAVE_SATURATION = {4: 3, 3: 3, 2: 2}
# a single pass of k >= 1 full waves of R programs per SM and a last one filled to at most W - 1 (``single_pass_tail``)
# ends on a few lone programs: a dual-path call runs it alone only for an even batch of mean length < TAIL_LONG_TOKENS.
# {tile class: (R, W)}; "small_group"'s single pass runs the MHA tile (docs/design.md, "Single-pass tails")
TAIL_WAVES = {"mha": (3, 1.4), "grouped": (4, 1.4), "small_group": (3, 1.3), "deep": (2, 1.25)}
TAIL_LONG_TOKENS = 1024
# ...and a fuller last wave, up to W - 1 of these, is a tail for the MHA and grouped tiles when the mean visible
# length is at least TAIL_FULLER_TOKENS (the measurements above); None: off
TAIL_FULLER = {"mha": 1.55, "grouped": 1.55}
TAIL_FULLER_TOKENS = 4096
# under the tail gate, an even batch of long sequences runs the single pass over the sequences of the full waves and
# the planned path over the rest, at once (``single_pass_tail``); False: the planned path takes all of them, and
# only a single pass of one wave and a bit has a tail (docs/design.md, "The tail split")
TAIL_SPLIT = True
# the head dims measured (other dims take other tiles, whose programs per SM were not)
TAIL_HEAD_DIMS = (128, 256)
# deterministic mode: tokens per split, a multiple of every BLOCK_N (long sequences still spread over the SMs)
DETERMINISTIC_SPLIT_TOKENS = 1024
# probe only (scripts/perf_probe.py grid): the fixed mode with the planned grid's launch shape, its chunk slots
# padded to this many (idle programs past B * S) and its grid heads-first by tile class
FIXED_GRID_SLOTS = 0
FIXED_HEADS_FIRST = False
# the cut's counts and mean in int32 where the shapes bound them (``narrow_cut``); False: int64 always
NARROW_CUT = True


@triton.jit
def lengths_tile(SEQLENS, stride_sl, batch, first_seq, BLOCK_B: tl.constexpr):
    """(offs_b, mine, seqlens): the lengths of sequences first_seq..B-1 as a [BLOCK_B] tile (0 elsewhere), the ones
    ``_chunk_layout`` cuts."""
    offs_b = tl.arange(0, BLOCK_B)
    mine = (offs_b >= first_seq) & (offs_b < batch)
    return offs_b, mine, tl.load(SEQLENS + offs_b * stride_sl, mask=mine, other=0)


@triton.jit
def most_chunks(mine, seqlens, window, LOG2_BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr, Q_LEN: tl.constexpr):
    """A bound on ``_chunk_layout``'s chunk count without the cut: the smallest candidate (BLOCK_N tokens) gives each
    sequence the most chunks, max(ceil(L_b / BLOCK_N), 1)."""
    lens = seqlens - window_starts(seqlens, window, HAS_WINDOW, Q_LEN)
    block_n = 1 << LOG2_BLOCK_N
    return tl.sum(tl.where(mine, tl.maximum((lens + (block_n - 1)) >> LOG2_BLOCK_N, 1), 0), axis=0)


@triton.jit
def _chunk_layout(
    mine, seqlens, batch, first_seq, num_kv_heads, max_chunks, window, NUM_SMS: tl.constexpr, BLOCK_N: tl.constexpr,
    LOG2_BLOCK_N: tl.constexpr, NUM_CAND: tl.constexpr,
    SATURATION: tl.constexpr, OVERHEAD: tl.constexpr, HAS_WINDOW: tl.constexpr, Q_LEN: tl.constexpr,
    WAVE_SAT: tl.constexpr = 0, NARROW: tl.constexpr = False,
):  # fmt: skip
    """The planned mode's cut, identical in every program and in ``chunk_plan``.

    L_b is the visible length: with a sliding window, the tokens from the window's first one (``window_start``) to
    the end, so a 32k sequence with a 4k window is cut like a 4k one and the pages before the window are never read.
    Only sequences first_seq..B-1 are cut (0 normally; under the tail gate, the sequences after the single pass's
    ones): the others get no chunk and count as empty.

    Candidate chunk sizes C_k = BLOCK_N * 2^k. With N_k = sum_b ceil(L_b / C_k) chunks, P_k = Hkv * N_k programs on
    S SMs, an SM runs ceil(P_k / S) of them one after another, of sum_b L_b / N_k tokens each on average, and needs
    SATURATION resident ones to reach its share of the bandwidth, so that a chunk of min(C_k, max L) tokens takes a
    resident set's time: cost_k = max(ceil(P_k / S) * (mean_k + OVERHEAD), SATURATION * (min(C_k, max L) + OVERHEAD))
    (for a uniform batch cut evenly, max(ceil(P_k / S), SATURATION) * (C_k + OVERHEAD)). With WAVE_SAT > 0 the
    ceil(P_k / S) programs run in waves of SATURATION (the resident ones) and a last partial wave of r programs costs
    max(r, WAVE_SAT) (fewer than WAVE_SAT do not reach the SM's bandwidth), and the longest chunk WAVE_SAT * (min(C_k,
    max L) + OVERHEAD): a batch cut into slightly more programs than fit at once pays for its second wave. The
    cheapest feasible candidate (N_k <= max_chunks, the grid's slots) wins, ties to the larger chunk. NUM_SMS is a
    compile-time constant (one per device), so the division by it is a multiply and a shift. NARROW (``narrow_cut``:
    B * table tokens * Hkv < 2^31): the counts, sums and the mean's division in int32, the costs in int64 (a 64-bit
    division is a long dependent sequence on every program's path to its first load).
    Returns (C, chunks per sequence n [BLOCK_B], inclusive prefix sum of n [BLOCK_B],
    uneven: the cut sequences fail ``even_test``, so the planner orders their chunks and evens them out).
    """
    lens = seqlens - window_starts(seqlens, window, HAS_WINDOW, Q_LEN)
    max_len = tl.max(lens, axis=0)
    offs_k = tl.arange(0, NUM_CAND)
    cand = BLOCK_N << offs_k
    # [NUM_CAND, BLOCK_B] -> [NUM_CAND] chunks per candidate; ceil(L / 2^j) as a shift, not an integer division
    shift = (offs_k + LOG2_BLOCK_N)[:, None]
    # every sequence gets at least one chunk: an empty one's single empty chunk writes out = 0, lse = -inf itself
    per_seq = tl.where(mine, tl.maximum((lens[None, :] + (cand[:, None] - 1)) >> shift, 1), 0)
    # an SM's programs one after another, each of the mean chunk length, or one resident set of the longest chunk
    count_t: tl.constexpr = tl.int32 if NARROW else tl.int64
    count = tl.sum(per_seq.to(count_t), axis=1)
    total = tl.sum(lens.to(count_t), axis=0)
    per_sm = tl.cdiv(count * num_kv_heads, NUM_SMS).to(tl.int64)
    mean = tl.cdiv(total, tl.maximum(count, 1)).to(tl.int64)
    total = total.to(tl.int64)
    longest = (tl.minimum(cand, max_len) + OVERHEAD).to(tl.int64)
    if WAVE_SAT:
        # waves of SATURATION resident programs; a partial last wave of r < WAVE_SAT runs at r / WAVE_SAT of the
        # SM's bandwidth, so it costs WAVE_SAT programs' time (a division by a constexpr: a multiply and a shift)
        full = per_sm // SATURATION
        rem = per_sm - full * SATURATION
        waves = full * SATURATION + tl.where(rem > 0, tl.maximum(rem, WAVE_SAT), 0)
        cost = tl.maximum(waves * (mean + OVERHEAD), WAVE_SAT * longest)
    else:
        cost = tl.maximum(per_sm * (mean + OVERHEAD), SATURATION * longest)
    # infeasible candidates lose; the index in the low bits breaks ties toward the larger chunk
    key = tl.where(count <= max_chunks, cost, 1 << 40) * NUM_CAND + (NUM_CAND - 1 - offs_k)
    k_best = NUM_CAND - 1 - (tl.min(key, axis=0) % NUM_CAND)
    chunk = BLOCK_N << k_best.to(tl.int32)
    n = tl.where(mine, tl.maximum((lens + (chunk - 1)) >> (k_best.to(tl.int32) + LOG2_BLOCK_N), 1), 0)
    uneven = ~even_test(max_len, total, batch - first_seq)
    return chunk, n, tl.cumsum(n, axis=0), uneven


@triton.jit
def chunk_bounds(first_token, visible, k, n, chunk, BLOCK_N: tl.constexpr, EQUAL: tl.constexpr):
    """[start, end) of chunk k of a sequence's n chunks over its visible tokens [first_token, first_token +
    visible): ``chunk`` tokens each from the start, the last one the rest; EQUAL: its T tiles dealt evenly, chunk k
    taking tiles [k * T / n, (k + 1) * T / n) (sizes differ by at most a tile, as fixed splits; n chunks of
    ``chunk`` tokens cover the sequence, so these do too, none longer)."""
    if EQUAL:
        # n >= 1 (callers clamp an unused slot's 0); a constexpr n divides by a multiply and a shift
        tiles = tl.cdiv(visible, BLOCK_N)
        start = first_token + (k * tiles // n) * BLOCK_N
        end = first_token + ((k + 1) * tiles // n) * BLOCK_N
    else:
        start = first_token + k * chunk
        end = start + chunk
    return start, tl.minimum(end, first_token + visible)


@triton.jit
def dispatch_chunks(
    slots, chunk, n, incl, visible, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, EQUAL: tl.constexpr,
):  # fmt: skip
    """An uneven batch's dispatch order, longest first: (sequence, chunk id) of each grid slot in
    ``slots`` [BLOCK_I], for a cut of n [BLOCK_B] chunks per sequence (``chunk_bounds`` of ``chunk`` tokens, EQUAL
    as there; visible: the visible lengths). Every sequence's chunks but its last (the longest: ``chunk`` tokens, or
    with EQUAL at least as long as the last), in sequence order, then each sequence's last chunk by ``bucket_ranks``
    of its length, so that a grid that runs in waves ends on its shortest programs instead of on a long sequence's
    chunks (sequence order puts them wherever the sequence sits). Ranked as ``chunk`` instead, with EQUAL, the
    several-chunk sequences' last chunks lost 4-6% on the H200 (scripts/order_probe.py --variants planner at
    05793bc against ef2f631: 200 x 100..8000 12/2 199.6 -> 207.5 µs, 48 x 256..16000 32/8 374.0 -> 397.8). Chunk
    ids stay in sequence order (``_plan_kernel``); ``dispatch_order`` is the host mirror."""
    offs_b = tl.arange(0, BLOCK_B)
    valid = n > 0
    full = tl.where(valid, n - 1, 0)
    full_incl = tl.cumsum(full, axis=0)
    num_full = tl.sum(full, axis=0)
    is_full = slots < num_full
    seq_full = tl.sum((full_incl[None, :] <= slots[:, None]).to(tl.int32), axis=1)
    last_start, _ = chunk_bounds(0, visible, full, tl.maximum(n, 1), chunk, BLOCK_N, EQUAL)
    seq = tl.where(is_full, seq_full, bucket_ranks(visible - last_start, valid, slots - num_full))
    # the slot's chunk within its sequence (a full chunk's place among them, or the last), then its id
    pick = offs_b[None, :] == seq[:, None]
    k_full = slots - tl.sum(tl.where(pick, (full_incl - full)[None, :], 0), axis=1)
    k = tl.where(is_full, k_full, tl.sum(tl.where(pick, full[None, :], 0), axis=1))
    return seq, tl.sum(tl.where(pick, (incl - n)[None, :], 0), axis=1) + k


@triton.jit
def _plan_kernel(
    SEQLENS, PLAN, COUNTERS, num_counters, batch, tail_first, num_kv_heads, max_chunks, stride_sl, window,
    NUM_SMS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, LOG2_BLOCK_N: tl.constexpr,
    NUM_CAND: tl.constexpr, SATURATION: tl.constexpr, OVERHEAD: tl.constexpr, BLOCK_I: tl.constexpr,
    HAS_WINDOW: tl.constexpr, Q_LEN: tl.constexpr, USE_PDL: tl.constexpr, EVEN_B: tl.constexpr = 0,
    WAVE_SAT: tl.constexpr = 0, LONG_MEAN: tl.constexpr = 0, EVEN_SPAN: tl.constexpr = 0, ORDER: tl.constexpr = False,
    EQUAL: tl.constexpr = False, NARROW: tl.constexpr = False,
):  # fmt: skip
    """Write the planned cut once, for the partial and combine kernels to read: PLAN is int32
    [4, max_chunks + B]: for grid slot i < max_chunks, rows (sequence or B if unused, chunk start, chunk end, chunk id)
    in dispatch order (ORDER: an uneven batch's longest first, ``dispatch_chunks``; else chunk id order; EQUAL: an
    uneven batch's chunks even within each sequence, ``chunk_bounds``), the chunk id numbering each
    sequence's chunks consecutively (where its partials go); for sequence b at column max_chunks + b: (first chunk
    id, chunk count, -, -). Also zeroes the num_counters int32 COUNTERS of the fused combine (``merge_if_last``).
    Grid: chunk slots / BLOCK_I. EVEN_B > 0 (dual-path call): nothing to do when the batch is even (the single pass
    before it writes the output), or only the sequences from tail_first on (``planned_from``)."""
    if not EVEN_B:
        # a call's first kernel (``chain_pdl``); in a dual-path call the lengths it reads are an input, and the single
        # pass before it writes nothing it reads
        wait_for_previous(USE_PDL)
    let_next_start(USE_PDL)
    first_seq = 0
    if EVEN_B:
        first_seq = planned_from(
            SEQLENS, stride_sl, batch, window, tail_first, EVEN_B, HAS_WINDOW, Q_LEN, LONG_MEAN, EVEN_SPAN
        )  # fmt: skip
        if first_seq < 0:
            return
    offs_b, mine, lens = lengths_tile(SEQLENS, stride_sl, batch, first_seq, BLOCK_B)
    chunk, n, incl, uneven = _chunk_layout(
        mine, lens, batch, first_seq, num_kv_heads, max_chunks, window, NUM_SMS,
        BLOCK_N, LOG2_BLOCK_N, NUM_CAND, SATURATION, OVERHEAD, HAS_WINDOW, Q_LEN, WAVE_SAT, NARROW,
    )  # fmt: skip
    stride = max_chunks + batch
    offs_i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    # [BLOCK_I, BLOCK_B]: in sequence order, slot i holds chunk i, of the first sequence whose inclusive count exceeds i
    seq = tl.sum((incl[None, :] <= offs_i[:, None]).to(tl.int32), axis=1)
    chunk_id = offs_i
    if ORDER:
        if uneven:
            visible = lens - window_starts(lens, window, HAS_WINDOW, Q_LEN)
            seq, chunk_id = dispatch_chunks(offs_i, chunk, n, incl, visible, BLOCK_B, BLOCK_N, EQUAL)
    seq = tl.where(offs_i < tl.sum(n, axis=0), seq, batch)
    pick = offs_b[None, :] == seq[:, None]
    k = chunk_id - tl.sum(tl.where(pick, (incl - n)[None, :], 0), axis=1)
    seqlen = tl.sum(tl.where(pick, lens[None, :], 0), axis=1)
    first_token = window_starts(seqlen, window, HAS_WINDOW, Q_LEN)
    start, end = chunk_bounds(first_token, seqlen - first_token, k, 1, chunk, BLOCK_N, False)
    if EQUAL:
        if uneven:
            count = tl.maximum(tl.sum(tl.where(pick, n[None, :], 0), axis=1), 1)
            start, end = chunk_bounds(first_token, seqlen - first_token, k, count, chunk, BLOCK_N, True)
    mask_i = offs_i < max_chunks
    tl.store(PLAN + offs_i, seq, mask=mask_i)
    tl.store(PLAN + stride + offs_i, start, mask=mask_i)
    tl.store(PLAN + 2 * stride + offs_i, end, mask=mask_i)
    tl.store(PLAN + 3 * stride + offs_i, tl.where(seq < batch, chunk_id, offs_i), mask=mask_i)
    if tl.program_id(0) == 0:
        mask_b = offs_b < batch
        tl.store(PLAN + max_chunks + offs_b, incl - n, mask=mask_b)
        tl.store(PLAN + stride + max_chunks + offs_b, n, mask=mask_b)
        for c0 in range(0, num_counters, 1024):
            offs_c = c0 + tl.arange(0, 1024)
            tl.store(COUNTERS + offs_c, tl.zeros([1024], tl.int32), mask=offs_c < num_counters)


@triton.jit
def inline_chunk(
    offs_b, mine, seqlens, chunk_id, seq_of_interest, batch, first_seq, num_kv_heads, max_chunks, window,
    NUM_SMS: tl.constexpr, BLOCK_N: tl.constexpr, LOG2_BLOCK_N: tl.constexpr, NUM_CAND: tl.constexpr,
    SATURATION: tl.constexpr, OVERHEAD: tl.constexpr, HAS_WINDOW: tl.constexpr, Q_LEN: tl.constexpr,
    WAVE_SAT: tl.constexpr = 0, EQUAL: tl.constexpr = False, NARROW: tl.constexpr = False,
):  # fmt: skip
    """The planned cut computed in place, without the planner launch (small batches: the layout of <= 16 lengths
    costs a program less than waiting for a planner kernel). For chunk slot chunk_id (or, with chunk_id < 0, for
    sequence seq_of_interest): (seq, seqlen, start, end, first chunk, chunk count), exactly what _plan_kernel
    writes (sequences from first_seq on); an unused slot has seq = B (and seqlen 0)."""
    chunk, n, incl, uneven = _chunk_layout(
        mine, seqlens, batch, first_seq, num_kv_heads, max_chunks, window, NUM_SMS,
        BLOCK_N, LOG2_BLOCK_N, NUM_CAND, SATURATION, OVERHEAD, HAS_WINDOW, Q_LEN, WAVE_SAT, NARROW,
    )  # fmt: skip
    seq = tl.where(chunk_id < 0, seq_of_interest, tl.sum((incl <= chunk_id).to(tl.int32), axis=0))
    pick = offs_b == seq
    first = tl.sum(tl.where(pick, incl - n, 0), axis=0)
    count = tl.sum(tl.where(pick, n, 0), axis=0)
    # from the lengths already in registers: a second global load would sit on every program's critical path
    seqlen = tl.sum(tl.where(pick, seqlens, 0), axis=0)
    first_token = window_start(seqlen, window, HAS_WINDOW, Q_LEN)
    start, end = chunk_bounds(first_token, seqlen - first_token, chunk_id - first, 1, chunk, BLOCK_N, False)
    if EQUAL:
        if uneven:
            start, end = chunk_bounds(
                first_token, seqlen - first_token, chunk_id - first, tl.maximum(count, 1), chunk, BLOCK_N, True
            )  # fmt: skip
    return seq, seqlen, start, end, first, count


@triton.jit
def fixed_chunk(
    SEQLENS, stride_sl, chunk_id, batch, window, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_TOKENS: tl.constexpr = 0, HAS_WINDOW: tl.constexpr = False, Q_LEN: tl.constexpr = 1,
):  # fmt: skip
    """Fixed mode: (seq, seqlen, start, end) of chunk chunk_id = split s of sequence b, boundaries on BLOCK_N-tile
    edges of the sequence's own visible range (the rule of ``split_bounds``); SPLIT_TOKENS > 0 (deterministic
    mode): splits of that many tokens."""
    seq = chunk_id // NUM_SPLITS
    # a padded grid's slots past B * S (FIXED_GRID_SLOTS) read the last sequence's length and return (seq >= B)
    seqlen = tl.load(SEQLENS + tl.minimum(seq, batch - 1) * stride_sl)
    first = window_start(seqlen, window, HAS_WINDOW, Q_LEN)
    split = chunk_id % NUM_SPLITS
    if SPLIT_TOKENS > 0:
        start = first + split * SPLIT_TOKENS
        end = tl.minimum(start + SPLIT_TOKENS, seqlen)
    else:
        # split s takes tiles [s * T / S, (s + 1) * T / S) of the T tiles: sizes differ by at most one tile, so any
        # S (not only a divisor of T) balances the programs
        start, end = chunk_bounds(first, seqlen - first, split, NUM_SPLITS, 0, BLOCK_N, True)
    return seq, seqlen, start, end


@triton.jit
def sequence_chunks(PLAN, seq, batch, max_chunks):
    """(first chunk, chunk count) of sequence seq, from the per-sequence columns _plan_kernel wrote (column
    max_chunks + seq of rows 0 and 1)."""
    return tl.load(PLAN + max_chunks + seq), tl.load(PLAN + 2 * max_chunks + batch + seq)


@triton.jit
def planned_chunk(PLAN, slot, seq, batch, max_chunks):
    """Planned mode: (start, end, single, chunk id) of a used grid slot of sequence seq, as _plan_kernel wrote them;
    single when the chunk is the whole sequence (its program writes the final output). The loads of the slot's row
    and of the sequence's count issue together (the count's address needs only seq)."""
    stride = max_chunks + batch
    start = tl.load(PLAN + stride + slot)
    end = tl.load(PLAN + 2 * stride + slot)
    chunk_id = tl.load(PLAN + 3 * stride + slot)
    _, count = sequence_chunks(PLAN, seq, batch, max_chunks)
    return start, end, count == 1, chunk_id


@triton.jit
def locate_chunk(
    PLAN, SEQLENS, stride_sl, slot, batch, max_chunks, window, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_TOKENS: tl.constexpr = 0, HAS_WINDOW: tl.constexpr = False, Q_LEN: tl.constexpr = 1,
):  # fmt: skip
    """The work of partial program `slot` (its grid position along the chunks), in either mode: (seq, seqlen, start,
    end, single, chunk id). In the planned mode an unused slot has seq = B (the caller returns); single: the chunk is
    its whole sequence; chunk id: where its partials go (the plan's dispatch order maps slots to chunk ids; fixed
    mode: the slot itself)."""
    if NUM_SPLITS > 0:
        seq, seqlen, start, end = fixed_chunk(
            SEQLENS, stride_sl, slot, batch, window, NUM_SPLITS, BLOCK_N, SPLIT_TOKENS, HAS_WINDOW, Q_LEN
        )
        single = False
        chunk_id = slot
    else:
        # planned: the cut _plan_kernel wrote (sequence B marks an unused slot; its loads stay in bounds)
        seq = tl.load(PLAN + slot)
        start, end, single, chunk_id = planned_chunk(PLAN, slot, tl.minimum(seq, batch - 1), batch, max_chunks)
        seqlen = tl.load(SEQLENS + tl.minimum(seq, batch - 1) * stride_sl)
        # a host table (``host_table``) ends each sequence's last chunk past any length, so the call's lengths end
        # it, and a table made for other lengths stays right (a chunk past the end is empty); the planner's cut
        # already lies within them
        end = tl.minimum(end, seqlen)
        start = tl.minimum(start, end)
    return seq, seqlen, start, end, single, chunk_id


@triton.jit
def store_chunk(
    O_PART, LSE_PART, OUT, LSE, SINKS, chunk_id, seq, kv_head, head_block, out, lse, single,
    stride_ob, stride_ot, stride_oh, num_q_heads,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    WRITE_LSE: tl.constexpr, HAS_SINKS: tl.constexpr, Q_LEN: tl.constexpr,
):  # fmt: skip
    """A chunk's result for one head block (out [BLOCK_H, BLOCK_D] fp32 normalised, lse [BLOCK_H] natural log):
    straight to OUT / LSE when the chunk is its whole sequence (sinks join there), else to the fp32 partials that
    _combine_kernel merges: contiguous [chunks, Q_LEN * Hq, BLOCK_D] and [chunks, Q_LEN * Hq], row = token * Hq +
    head, with no sink (it joins once, in the combine)."""
    if single:
        store_group(
            OUT, LSE, SINKS, seq, kv_head, head_block, out, lse, stride_ob, stride_ot, stride_oh, num_q_heads,
            GROUP, HEAD_DIM, BLOCK_H, BLOCK_D, WRITE_LSE, HAS_SINKS, Q_LEN,
        )  # fmt: skip
    else:
        row_tok, row_head, mask_h = group_rows(head_block, kv_head, GROUP, Q_LEN, BLOCK_H)
        rows = chunk_id.to(tl.int64) * (Q_LEN * num_q_heads) + row_head
        if Q_LEN > 1:
            rows += row_tok * num_q_heads
        tl.store(O_PART + rows[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :], out, mask=mask_h[:, None])
        tl.store(LSE_PART + rows, lse, mask=mask_h)


@triton.jit
def merge_chunk(m_i, l_i, acc, O_PART, LSE_PART, chunk, mask_c, in_chunk, offs_d, num_q_heads, Q_LEN: tl.constexpr,
                BLOCK_D: tl.constexpr):  # fmt: skip
    """One step of the merge's online softmax over chunk LSEs (natural log): chunk ``chunk``'s partial rows
    (in_chunk [BLOCK_H] row offsets, mask_c the rows to read) read through L2 (.cg) into (m_i, l_i, acc)."""
    rows = chunk * (Q_LEN * num_q_heads) + in_chunk
    lse_c = tl.load(LSE_PART + rows, mask=mask_c, other=float("-inf"), cache_modifier=".cg")
    # [BLOCK_H, BLOCK_D]
    o_c = tl.load(O_PART + rows[:, None] * BLOCK_D + offs_d[None, :], mask=mask_c[:, None], other=0.0,
                  cache_modifier=".cg")  # fmt: skip
    # m_i here is the running max of chunk LSEs, natural log (not the kernels' log2 scores)
    m_new = tl.maximum(m_i, lse_c)
    # padding rows (and chunks past the end) stay -inf: measure from 0 so exp(-inf - 0) = 0
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_ref)
    w = tl.exp(lse_c - m_ref)
    return m_new, l_i * alpha + w, acc * alpha[:, None] + w[:, None] * o_c


@triton.jit
def merge_if_last(
    O_PART, LSE_PART, OUT, LSE, SINKS, COUNTERS, slot, seq, kv_head, head_block, first, count,
    stride_ob, stride_ot, stride_oh, num_q_heads,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    WRITE_LSE: tl.constexpr, HAS_SINKS: tl.constexpr, Q_LEN: tl.constexpr, FUSED_MAX: tl.constexpr,
    UNROLL: tl.constexpr, NUM_SPLITS: tl.constexpr = 0, RESET: tl.constexpr = False,
):  # fmt: skip
    """The fused combine: after a chunk program has stored its partial rows, the last of its sequence's chunk programs
    (for this KV head and head block) to arrive merges chunks first .. first + count - 1 into OUT / LSE, if there are
    at most FUSED_MAX of them (longer sequences are left to ``_combine_kernel``). Planned mode, or fixed mode with
    NUM_SPLITS > 0 and the plan's counters.

    * Arrival: every thread's stores, a CTA barrier, then one acq_rel atomic increment at GPU scope of the counter
      COUNTERS[slot] of (sequence, KV head, head block): slot = sequence * Hkv * head blocks + KV head * head
      blocks + head block (a counter index, not a grid slot). The program that finds count - 1 earlier arrivals has
      acquired every partial.
    * Merge: it reads them from L2 (.cg), in chunk order, UNROLL chunks per step, or all at once for at most
      MERGE_UNROLL_ALL fixed splits, so the result does not depend on the arrival order.
    * Reset: the planner or ``_zero_counters_kernel`` zeroes the counters before a planned call; in fixed mode and
      for a host table's counters (RESET), which no kernel zeroes, the merger resets its own counter for the next
      call.
    """
    if count <= FUSED_MAX:
        tl.debug_barrier()
        arrived = tl.atomic_add(COUNTERS + slot, 1, sem="acq_rel", scope="gpu")
        if arrived == count - 1:
            row_tok, row_head, mask_h = group_rows(head_block, kv_head, GROUP, Q_LEN, BLOCK_H)
            offs_d = tl.arange(0, BLOCK_D)
            # int64 row offsets within a chunk's [Q_LEN * Hq] rows; chunk ids are small (below the grid's chunk slots:
            # B + at most TAIL_EXTRA_PROGRAMS_PER_SM * #SMs / Hkv planned, B * S fixed)
            in_chunk = (row_tok * num_q_heads + row_head).to(tl.int64)
            # the combine's online softmax over chunk LSEs (natural log), [BLOCK_H] rows at once
            m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_H], tl.float32)
            acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
            if NUM_SPLITS > 0 and NUM_SPLITS <= MERGE_UNROLL_ALL:
                # fixed mode: the split count is a constant, so the loads of every split can issue at once
                for j in tl.static_range(NUM_SPLITS):
                    m_i, l_i, acc = merge_chunk(
                        m_i, l_i, acc, O_PART, LSE_PART, first + j, mask_h, in_chunk, offs_d, num_q_heads, Q_LEN,
                        BLOCK_D,
                    )  # fmt: skip
            else:
                end = first + count
                for c0 in range(first, end, UNROLL):
                    for j in tl.static_range(UNROLL):
                        m_i, l_i, acc = merge_chunk(
                            m_i, l_i, acc, O_PART, LSE_PART, c0 + j, mask_h & (c0 + j < end), in_chunk, offs_d,
                            num_q_heads, Q_LEN, BLOCK_D,
                        )  # fmt: skip
            empty = l_i == 0.0
            out = acc / tl.where(empty, 1.0, l_i)[:, None]
            lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
            store_group(
                OUT, LSE, SINKS, seq, kv_head, head_block, out, lse, stride_ob, stride_ot, stride_oh, num_q_heads,
                GROUP, HEAD_DIM, BLOCK_H, BLOCK_D, WRITE_LSE, HAS_SINKS, Q_LEN,
            )  # fmt: skip
            if NUM_SPLITS > 0 or RESET:
                # fixed mode and host tables have no planner to zero the counters: every arrival is in, so reset it
                # for the next call
                tl.store(COUNTERS + slot, 0)


@triton.jit
def _partial_kernel(
    Q,
    K,
    V,
    SEQLENS,
    BLOCK_TABLE,
    PLAN,
    COUNTERS,
    O_PART,
    LSE_PART,
    OUT,
    LSE,
    ALIBI,
    SINKS,
    K_SCALE,
    V_SCALE,
    qk_scale,
    softcap,
    window,
    num_q_heads,
    batch,
    tail_first,
    max_chunks,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_sl,
    stride_btb,
    stride_btp,
    stride_ob,
    stride_ot,
    stride_oh,
    NUM_SPLITS: tl.constexpr,
    SPLIT_TOKENS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_F32: tl.constexpr,
    USE_DOT: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    Q_LEN: tl.constexpr,
    KV_FP8: tl.constexpr,
    SCALE_PTR: tl.constexpr,
    PREFETCH_PAGES: tl.constexpr,
    HEADS_FIRST: tl.constexpr,
    USE_PDL: tl.constexpr,
    FUSED_MAX: tl.constexpr,
    MERGE_UNROLL: tl.constexpr,
    NUM_SMS: tl.constexpr,
    INLINE_PLAN: tl.constexpr,
    BLOCK_B: tl.constexpr,
    LOG2_BLOCK_N: tl.constexpr,
    NUM_CAND: tl.constexpr,
    SATURATION: tl.constexpr,
    OVERHEAD: tl.constexpr,
    EVEN_B: tl.constexpr = 0,
    WAVE_SAT: tl.constexpr = 0,
    LONG_MEAN: tl.constexpr = 0,
    EVEN_SPAN: tl.constexpr = 0,
    OFFS_I32: tl.constexpr = False,
    V_T: tl.constexpr = False,
    LAST: tl.constexpr = False,
    HOST_TABLE: tl.constexpr = False,
    EQUAL: tl.constexpr = False,
    NARROW: tl.constexpr = False,
    INLINE_EXIT: tl.constexpr = False,
    table_tokens=0,
    len_hint=0,
    EARLY_PAGES: tl.constexpr = False,
):
    """One program per (chunk slot, KV head x head block): runs the online softmax over one chunk of one sequence.

    Grid (slots, Hkv * HEAD_BLOCKS), or (Hkv * HEAD_BLOCKS, slots) with HEADS_FIRST. Where the slot's chunk comes
    from: NUM_SPLITS > 0, fixed splits (slot b * S + s is split s of sequence b); INLINE_PLAN, the cut computed here
    from the lengths (<= 16 sequences); else the planner's PLAN table, or the host's (HOST_TABLE). A sequence of one
    chunk is written straight to OUT / LSE; the others write partials (O_PART normalised, LSE_PART natural log), and
    with FUSED_MAX > 0 the last of a sequence's chunks to arrive merges them (``merge_if_last``, up to FUSED_MAX
    chunks). LAST: no combine launch follows this kernel. EVEN_B: a dual-path call's planned half (0: off, else the
    lengths tile's width), which returns on a batch the single pass takes. Shapes: ``attend_group``.
    """
    first_seq = 0
    if EVEN_B:
        # dual-path call: an even batch is the single pass's, or its sequences before tail_first (before the wait:
        # the lengths are an input)
        first_seq = planned_from(
            SEQLENS, stride_sl, batch, window, tail_first, EVEN_B, HAS_WINDOW, Q_LEN, LONG_MEAN, EVEN_SPAN
        )  # fmt: skip
        if first_seq < 0:
            return
    # HEADS_FIRST: grid (Hkv * head blocks, chunks), so that programs dispatched together read the heads of the same
    # token rows (and unused chunk slots come last); else (chunks, Hkv * head blocks)
    if HEADS_FIRST:
        chunk_id = tl.program_id(1)
        head_id = tl.program_id(0)
        num_head_ids = tl.num_programs(0)
    else:
        chunk_id = tl.program_id(0)
        head_id = tl.program_id(1)
        num_head_ids = tl.num_programs(1)
    kv_head = head_id // HEAD_BLOCKS
    head_block = head_id % HEAD_BLOCKS
    # planned mode: launched while the planner (or the counters' zeroing kernel) runs; fixed mode or in place
    # without the fused merge: the call's first kernel
    wait_for_previous(USE_PDL)
    if not LAST:
        # the combine may start now (it waits for this grid)
        let_next_start(USE_PDL)

    early_first = 0
    early_pages = 0
    if EARLY_PAGES:
        # fixed mode, no window: where this split starts if its sequence has the plan's length; its first page ids
        # are loaded from there before the length is (attend_range), so that no instruction waits for the length
        # before their load has issued
        early_first, _ = chunk_bounds(0, len_hint, chunk_id % NUM_SPLITS, NUM_SPLITS, 0, BLOCK_N, True)
        early_row = BLOCK_TABLE + tl.minimum(chunk_id // NUM_SPLITS, batch - 1).to(tl.int64) * stride_btb
        early_pages = first_page_ids(early_row, stride_btp, early_first, table_tokens, PAGE_SIZE, BLOCK_N)
    if INLINE_PLAN:
        offs_b, mine, seqlens = lengths_tile(SEQLENS, stride_sl, batch, first_seq, BLOCK_B)
        if INLINE_EXIT:
            # a slot past the most chunks the lengths allow has no work: it returns before the cut (an MHA grid's
            # unused slots come before other heads' busy ones in dispatch order)
            if chunk_id >= most_chunks(mine, seqlens, window, LOG2_BLOCK_N, HAS_WINDOW, Q_LEN):
                return
        seq, seqlen, start, end, first, count = inline_chunk(
            offs_b, mine, seqlens, chunk_id, 0, batch, first_seq, num_head_ids // HEAD_BLOCKS, max_chunks, window,
            NUM_SMS, BLOCK_N, LOG2_BLOCK_N, NUM_CAND, SATURATION, OVERHEAD, HAS_WINDOW, Q_LEN, WAVE_SAT, EQUAL, NARROW,
        )  # fmt: skip
        single = count == 1
    else:
        # the grid slot's chunk: chunk_id becomes where its partials go
        seq, seqlen, start, end, single, chunk_id = locate_chunk(
            PLAN, SEQLENS, stride_sl, chunk_id, batch, max_chunks, window,
            NUM_SPLITS, BLOCK_N, SPLIT_TOKENS, HAS_WINDOW, Q_LEN,
        )  # fmt: skip
    if seq >= batch:
        return
    seq = seq.to(tl.int64)
    out, lse = attend_group(
        Q, K, V, BLOCK_TABLE + seq * stride_btb, seq, kv_head, head_block, seqlen, start, end, qk_scale,
        stride_qb, stride_qt, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_btp,
        ALIBI, K_SCALE, V_SCALE, softcap, window,
        GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_H, BLOCK_N, BLOCK_D, DOT_F32, USE_DOT,
        HAS_SOFTCAP, HAS_ALIBI, HAS_WINDOW, Q_LEN, KV_FP8, SCALE_PTR, PREFETCH_PAGES, OFFS_I32, V_T,
        early_first, early_pages, EARLY_PAGES,
    )  # fmt: skip
    if LAST:
        # no combine follows: the next call's first kernel may start when every program is here (as the single pass)
        let_next_start(USE_PDL)
    store_chunk(
        O_PART, LSE_PART, OUT, LSE, SINKS, chunk_id, seq, kv_head, head_block, out, lse, single,
        stride_ob, stride_ot, stride_oh, num_q_heads,
        GROUP, HEAD_DIM, BLOCK_H, BLOCK_D, WRITE_LSE, HAS_SINKS, Q_LEN,
    )  # fmt: skip
    if FUSED_MAX > 0 and not single:
        # the sequence's chunk ids: fixed mode's are sequence-major; the in-place cut gave them above
        if NUM_SPLITS > 0:
            first = seq * NUM_SPLITS
            count = NUM_SPLITS
        elif not INLINE_PLAN:
            first, count = sequence_chunks(PLAN, seq, batch, max_chunks)
        merge_if_last(
            O_PART, LSE_PART, OUT, LSE, SINKS, COUNTERS, seq * num_head_ids + head_id, seq, kv_head, head_block,
            first, count, stride_ob, stride_ot, stride_oh, num_q_heads,
            GROUP, HEAD_DIM, BLOCK_H, BLOCK_D, WRITE_LSE, HAS_SINKS, Q_LEN, FUSED_MAX, MERGE_UNROLL, NUM_SPLITS,
            HOST_TABLE,
        )  # fmt: skip


@triton.jit
def _combine_kernel(
    O_PART,
    LSE_PART,
    OUT,
    LSE,
    PLAN,
    SINKS,
    batch,
    max_chunks,
    num_q_heads,
    stride_ob,
    stride_ot,
    stride_oh,
    NUM_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DC: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    USE_PDL: tl.constexpr,
    MERGED_MAX: tl.constexpr,
    SEQLENS,
    tail_first,
    stride_sl,
    num_kv_heads,
    window,
    NUM_SMS: tl.constexpr,
    INLINE_PLAN: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LOG2_BLOCK_N: tl.constexpr,
    NUM_CAND: tl.constexpr,
    SATURATION: tl.constexpr,
    OVERHEAD: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    Q_LEN: tl.constexpr,
    EVEN_B: tl.constexpr = 0,
    WAVE_SAT: tl.constexpr = 0,
    LONG_MEAN: tl.constexpr = 0,
    EVEN_SPAN: tl.constexpr = 0,
    LONG_ONLY: tl.constexpr = 0,
    NARROW: tl.constexpr = False,
    SMALL_S: tl.constexpr = 0,
):
    """Merges one sequence's chunks for one query row: LSE = log sum_c exp(lse_c), out = sum_c exp(lse_c - LSE) o_c.

    Grid (q_len * Hq rows, B sequences, head-dim blocks of BLOCK_DC columns). The chunks come from fixed splits
    (NUM_SPLITS > 0), the in-place cut (INLINE_PLAN, computed before the PDL wait) or the planner's PLAN columns.
    A sequence of at most MERGED_MAX chunks was written by its partial programs (``merge_if_last``) and is skipped.
    LONG_ONLY (0: off, else the lengths tile's width): dim 1 counts only the sequences that can have more than
    MERGED_MAX chunks, and program k finds the k-th of them. The chunks' LSEs are read BLOCK_S at a time.
    """
    first_seq = 0
    if EVEN_B:
        # dual-path call: an even batch is the single pass's, or its sequences before tail_first (before the wait:
        # the lengths are an input; the plan gives those no chunk, so they return below)
        first_seq = planned_from(
            SEQLENS, stride_sl, batch, window, tail_first, EVEN_B, HAS_WINDOW, Q_LEN, LONG_MEAN, EVEN_SPAN
        )  # fmt: skip
        if first_seq < 0:
            return
    # one program per (query row = token * Hq + head, sequence, block of BLOCK_DC head-dim columns); with LONG_ONLY
    # dim 1 counts the long sequences instead (found below)
    row = tl.program_id(0)
    seq = tl.program_id(1)
    d0 = tl.program_id(2) * BLOCK_DC
    num_rows = tl.num_programs(0)
    head = row % num_q_heads
    if INLINE_PLAN:
        # the in-place plan's cut of the lengths (an input: no kernel of this call writes them), before waiting, so
        # that it overlaps the partial kernel's last programs
        offs_b, mine, seqlens = lengths_tile(SEQLENS, stride_sl, batch, first_seq, BLOCK_B)
        if LONG_ONLY:
            # this program's sequence is the seq-th of those with more than MERGED_MAX chunks (as below)
            _, n, incl, _ = _chunk_layout(
                mine, seqlens, batch, first_seq, num_kv_heads, max_chunks, window, NUM_SMS, BLOCK_N, LOG2_BLOCK_N,
                NUM_CAND, SATURATION, OVERHEAD, HAS_WINDOW, Q_LEN, WAVE_SAT, NARROW,
            )  # fmt: skip
            long = n > MERGED_MAX
            pick = long & (tl.cumsum(long.to(tl.int32), axis=0) == seq + 1)
            if tl.sum(pick.to(tl.int32), axis=0) == 0:
                return
            seq = tl.sum(tl.where(pick, offs_b, 0), axis=0)
            first = tl.sum(tl.where(pick, incl - n, 0), axis=0)
            count = tl.sum(tl.where(pick, n, 0), axis=0)
        else:
            _, _, _, _, first, count = inline_chunk(
                offs_b, mine, seqlens, -1, seq, batch, first_seq, num_kv_heads, max_chunks, window, NUM_SMS,
                BLOCK_N, LOG2_BLOCK_N, NUM_CAND, SATURATION, OVERHEAD, HAS_WINDOW, Q_LEN, WAVE_SAT, NARROW=NARROW,
            )  # fmt: skip
            if count <= MERGED_MAX:
                # written by its partial program
                return
    wait_for_previous(USE_PDL)
    if NUM_SPLITS > 0:
        first = seq * NUM_SPLITS
        count = NUM_SPLITS
    elif not INLINE_PLAN:
        if LONG_ONLY:
            # grid dim 1 holds only as many sequences as can have more than MERGED_MAX chunks (launch_combine):
            # this program's is the seq-th of them, from the planner's [B] chunk counts
            offs_b = tl.arange(0, LONG_ONLY)
            counts = tl.load(PLAN + 2 * max_chunks + batch + offs_b, mask=offs_b < batch, other=0)
            long = counts > MERGED_MAX
            pick = long & (tl.cumsum(long.to(tl.int32), axis=0) == seq + 1)
            if tl.sum(pick.to(tl.int32), axis=0) == 0:
                return
            seq = tl.sum(tl.where(pick, offs_b, 0), axis=0)
        # the planner's per-sequence columns
        first, count = sequence_chunks(PLAN, seq, batch, max_chunks)
        if count <= MERGED_MAX:
            # written by its partial program (one chunk, or merged there: merge_if_last)
            return
    offs_d = d0 + tl.arange(0, BLOCK_DC)

    # the online softmax again, over the chunks' LSEs (natural log): running max, sum and weighted output; m_i and l_i
    # start as 0-d fp32 tensors (reductions of a tile), which a Python float would not be in the loop below
    m_i = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), axis=0)
    l_i = tl.sum(tl.zeros([BLOCK_S], tl.float32), axis=0)
    acc = tl.zeros([BLOCK_DC], tl.float32)
    if HAS_SINKS:
        # the sink is one more "chunk" of mass exp(sink) and output 0, counted once per row
        m_i = tl.load(SINKS + head)
        l_i = l_i + 1.0
    start = 0
    if SMALL_S > 0:
        # a sequence of few chunks in one small block (fewer masked lanes); a long one in the wide blocks below, whose
        # dependent loads it chains fewer times (the loop stays outside the branch)
        if count <= SMALL_S:
            m_i, l_i, acc = merge_block(
                O_PART, LSE_PART, first, 0, count, row, num_rows, offs_d, m_i, l_i, acc, SMALL_S, BLOCK_D
            )  # fmt: skip
            start = count
    for s0 in range(start, count, BLOCK_S):
        m_i, l_i, acc = merge_block(
            O_PART, LSE_PART, first, s0, count, row, num_rows, offs_d, m_i, l_i, acc, BLOCK_S, BLOCK_D
        )  # fmt: skip

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)
    seq = seq.to(tl.int64)
    tok = (row // num_q_heads).to(tl.int64)
    out_ptrs = OUT + seq * stride_ob + tok * stride_ot + head.to(tl.int64) * stride_oh + offs_d
    # the call's last kernel: the next call's first one may start (``chain_pdl``)
    let_next_start(USE_PDL)
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=offs_d < HEAD_DIM)
    if WRITE_LSE and d0 == 0:
        lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
        tl.store(LSE + seq * num_rows + row, lse)


@triton.jit
def merge_block(
    O_PART, LSE_PART, first, s0, count, row, num_rows, offs_d, m_i, l_i, acc,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One step of the combine's online softmax: chunks s0..s0 + BLOCK_S - 1 (of the count from ``first``) of one
    row, merged into the running (max, sum, weighted output [BLOCK_DC]); returns them updated."""
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = s0 + offs_s < count
    rows = (first + s0 + offs_s).to(tl.int64) * num_rows + row
    # [BLOCK_S]; empty chunks hold -inf
    lse_s = tl.load(LSE_PART + rows, mask=mask_s, other=float("-inf"))
    m_new = tl.maximum(m_i, tl.max(lse_s, axis=0))
    # while every chunk so far is empty, measure from 0 so that exp(-inf - 0) = 0 rather than NaN
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_ref)
    w = tl.exp(lse_s - m_ref)
    # [BLOCK_S, BLOCK_DC]
    o = tl.load(O_PART + rows[:, None] * BLOCK_D + offs_d[None, :], mask=mask_s[:, None], other=0.0)
    acc = acc * alpha + tl.sum(w[:, None] * o, axis=0)
    l_i = l_i * alpha + tl.sum(w, axis=0)
    return m_new, l_i, acc


def grid_chunks(batch: int, num_kv_heads: int, num_sms: int, extra: int | None = None) -> int:
    """Chunk slots of the planned grid: one per sequence plus extra (EXTRA_PROGRAMS_PER_SM unless given) programs per
    SM. Sized from B and the SM count, never from the cache's capacity; the planner only picks cuts that fit."""
    return batch + cdiv((EXTRA_PROGRAMS_PER_SM if extra is None else extra) * num_sms, num_kv_heads)


def num_candidates(max_tokens: int, block_n: int) -> int:
    """Candidate chunk sizes block_n * 2^k, enough that the largest covers any sequence the table can hold (so one
    chunk per sequence is always feasible), as a power of two for tl.arange."""
    k = max(1, cdiv(max_tokens, block_n) - 1).bit_length() + 1
    return next_power_of_2(k)


def visible_start(seqlen: int, window_left: int | None, q_len: int = 1) -> int:
    """First token any query row can see (``triton_common.window_start``): 0 without a window."""
    return 0 if window_left is None else max(seqlen - q_len - window_left, 0)


def split_bounds(
    seqlen: int, num_splits: int, block_n: int, first: int = 0, split_tokens: int = 0
) -> list[tuple[int, int]]:
    """Fixed (and deterministic, split_tokens > 0) mode: [start, end) of each split of one sequence's visible tokens
    [first, seqlen), exactly as the partial kernel computes them (``fixed_chunk``): split s of S takes tiles
    [s * T / S, (s + 1) * T / S) of the T tiles, or split_tokens tokens from s * split_tokens."""
    tiles = cdiv(seqlen - first, block_n)
    bounds = []
    for split in range(num_splits):
        if split_tokens:
            start, end = first + split * split_tokens, first + (split + 1) * split_tokens
        else:
            start = first + split * tiles // num_splits * block_n
            end = first + (split + 1) * tiles // num_splits * block_n
        bounds.append((start, max(start, min(end, seqlen))))
    return bounds


def wave_saturation(saturation: int) -> int:
    """``_chunk_layout``'s WAVE_SAT for a planner target (WAVE_SATURATION; 0: the model without waves)."""
    return WAVE_SATURATION.get(saturation, saturation) if WAVE_SATURATION else 0


def chunk_size(
    visible, num_kv_heads, num_sms, max_chunks, block_n, num_cand, saturation=None
) -> int:  # fmt: skip
    """Planned mode: the chunk size ``_chunk_layout`` picks for these visible lengths (``chunk_plan``'s cut)."""
    saturation = SATURATION_PER_SM if saturation is None else saturation
    wave_sat = wave_saturation(saturation)
    max_len, total = max(visible, default=0), sum(visible)
    # each distinct length once, with its multiplicity: a uniform batch is one term
    lengths = collections.Counter(visible).items()
    best = None
    for k in range(num_cand):
        cand = block_n << k
        count = sum(times * max(cdiv(n, cand), 1) for n, times in lengths)
        per_sm = cdiv(count * num_kv_heads, num_sms)
        mean = cdiv(total, max(count, 1))
        longest = min(cand, max_len) + CHUNK_OVERHEAD_TOKENS
        if wave_sat:
            full, rem = divmod(per_sm, saturation)
            waves = full * saturation + (max(rem, wave_sat) if rem else 0)
            cost = max(waves * (mean + CHUNK_OVERHEAD_TOKENS), wave_sat * longest)
        else:
            cost = max(per_sm * (mean + CHUNK_OVERHEAD_TOKENS), saturation * longest)
        key = ((cost if count <= max_chunks else 1 << 40), -k)
        if best is None or key < best[0]:
            best = (key, cand)
    return best[1]


def dispatch_order(seqlens, chunk: int, block_n: int, window_left=None, q_len=1) -> list[int]:
    """``dispatch_chunks``'s order on the host (tests): the chunk id of each grid slot's chunk, for the planner's cut
    of these lengths into chunks of ``chunk`` tokens (``chunk_size``; chunk ids number each sequence's chunks
    consecutively, in sequence order)."""
    visible = visible_lengths(seqlens, window_left, q_len)
    counts = [max(cdiv(n, chunk), 1) for n in visible]
    firsts = [sum(counts[:b]) for b in range(len(counts))]
    if not PLANNER_ORDER or not visible or even_lengths(visible):
        return list(range(sum(counts)))
    full = [firsts[b] + j for b, count in enumerate(counts) for j in range(count - 1)]
    if PLANNER_EQUAL:
        lasts = [n - split_bounds(n, count, block_n)[-1][0] for n, count in zip(visible, counts)]
    else:
        lasts = [n - (count - 1) * chunk for n, count in zip(visible, counts)]
    return full + [firsts[b] + counts[b] - 1 for b in bucket_order(lasts)]


def chunk_plan(
    seqlens, num_kv_heads, num_sms, max_chunks, block_n, num_cand, window_left=None, q_len=1, saturation=None
) -> list[tuple[int, int, int]]:  # fmt: skip
    """Planned mode: (sequence, start, end) of every chunk, in chunk order, exactly as ``_chunk_layout`` cuts
    (over each sequence's visible tokens; saturation: the planner's programs per SM, SATURATION_PER_SM unless
    given)."""
    firsts = [visible_start(n, window_left, q_len) for n in seqlens]
    visible = [n - f for n, f in zip(seqlens, firsts)]
    chunk = chunk_size(visible, num_kv_heads, num_sms, max_chunks, block_n, num_cand, saturation)
    # an empty sequence keeps one empty chunk (its program writes out = 0, lse = -inf); an uneven batch's chunks are
    # even within each sequence
    equal = PLANNER_EQUAL and bool(visible) and not even_lengths(visible)
    plan = []
    for b, (n, f) in enumerate(zip(seqlens, firsts)):
        count = max(cdiv(n - f, chunk), 1)
        if equal:
            plan += [(b, lo, hi) for lo, hi in split_bounds(n, count, block_n, f)]
        else:
            plan += [(b, s, min(s + chunk, n)) for s in (range(f, n, chunk) if n > f else [f])]
    return plan


# a host table's candidate chunk lengths, in tiles: ceil(HOST_CHUNK_RATIO^i) and the planner's powers of two, up to
# the longest sequence
HOST_CHUNK_RATIO = 1.25
# ...taken over a power of two only when the model finds it this much cheaper: ragged 1 x 131072 + 63 x 1024 32/8
# costs 0.4% less in 48 chunks of 2731 tokens than in 64 of 2048, and took 207.8 µs against 187.8 (H200, graph µs,
# sweeps/host-table-0a102d3): the model does not see the short sequences' chunks packing around the long ones
HOST_FINER_GAIN = 0.03
# a host table's sequence of at most this many chunks is merged by its last chunk program (B * q_len * Hq >= #SMs):
# the merge overlaps the grid's shorter last programs where the combine launch waits for them; at ~31 chunks it loses
# (docs/design.md, "Uneven batches")
HOST_FUSED_MAX_CHUNKS = 16
# a host table ends each sequence's last chunk here, past any length (locate_chunk clamps it to the call's length)
OPEN_END = 2**31 - 1


def host_cut(visible, programs_per_chunk: int, num_sms: int, saturation: int, block_n: int) -> list[int]:
    """``host_table``'s chunks a sequence for these visible lengths: each sequence of t tiles in n = ceil(t / T)
    chunks of equal tiles (+-1), for the candidate T (HOST_CHUNK_RATIO steps) of least cost in the planner's model
    (``_chunk_layout``, with WAVE_SATURATION), its longest chunk being the longest of the equal ones. Ties go to the
    longer chunk; T other than a power of two must win by HOST_FINER_GAIN."""
    tiles = [cdiv(n, block_n) for n in visible]
    total = sum(visible)
    wave_sat, best = wave_saturation(saturation), None
    for cand in reversed(host_candidates(max(tiles))):
        counts = [max(1, cdiv(t, cand)) for t in tiles]
        per_sm = cdiv(sum(counts) * programs_per_chunk, num_sms)
        mean = cdiv(total, sum(counts)) + CHUNK_OVERHEAD_TOKENS
        longest = max(cdiv(n, c) for n, c in zip(visible, counts)) + CHUNK_OVERHEAD_TOKENS
        if wave_sat:
            full, rem = divmod(per_sm, saturation)
            waves = full * saturation + (max(rem, wave_sat) if rem else 0)
            cost = max(waves * mean, wave_sat * longest)
        else:
            cost = max(per_sm * mean, saturation * longest)
        # a chunk of a power of two tiles (the planner's candidates) unless another is HOST_FINER_GAIN cheaper
        cost *= 1.0 if cand & (cand - 1) == 0 else 1.0 + HOST_FINER_GAIN
        if best is None or cost < best[0]:
            best = (cost, counts)
    return best[1]


def host_candidates(t_max: int) -> list[int]:
    """``host_cut``'s chunk lengths in tiles, ascending: ceil(HOST_CHUNK_RATIO^i) and the powers of two, capped at
    the longest sequence's t_max tiles."""
    t_max = max(t_max, 1)
    steps = 2 + int(math.log(t_max, HOST_CHUNK_RATIO))
    cands = {math.ceil(HOST_CHUNK_RATIO**i) for i in range(steps)} | {1 << i for i in range(t_max.bit_length() + 1)}
    return sorted({min(t_max, c) for c in cands})


def host_table(visible, counts, block_n: int) -> list[list[int]]:
    """The planned mode's table [4, chunks + B] (``_plan_kernel``'s layout) of a cut made on the host: sequence b's
    counts[b] chunks split its tiles evenly (sizes differ by at most a tile), its last chunk ending at OPEN_END, chunk
    ids numbering each sequence's chunks consecutively; the grid slots (rows 0-3) go longest chunk first, so that the
    grid's last programs are its shortest."""
    chunks, firsts = [], []
    for b, (n, count) in enumerate(zip(visible, counts)):
        firsts.append(len(chunks))
        for s, (lo, hi) in enumerate(split_bounds(n, count, block_n)):
            chunks.append((b, lo, OPEN_END if s == count - 1 else hi, hi - lo))
    order = sorted(range(len(chunks)), key=lambda i: -chunks[i][3])
    pad = [0] * len(visible)
    seqs, starts, ends = ([chunks[i][j] for i in order] for j in range(3))
    return [seqs + firsts, starts + list(counts), ends + pad, order + pad]


def planner_shape(block_b: int) -> tuple[int, int]:
    """(chunk slots per planner program, warps) for a batch padded to block_b. Each program recomputes the cut and
    looks its slots up in a [slots, block_b] tile, so large batches want few slots per program (more programs, run
    side by side) and one warp. H200 (scripts/plan_probe.py, graph µs of the planner alone): 256 sequences 6.4 -> 2.1,
    512: 6.4 -> 2.9, 64: 3.3 -> 1.8; up to 16 sequences 64 slots x 4 warps is within 0.2 of the best."""
    return min(64, max(4, 256 // block_b)), (4 if block_b <= 16 else 1)


def launch_plan(
    cache_seqlens, num_kv_heads, num_sms, max_chunks, block_n, num_cand, saturation, pdl=False, features=None,
    counters=None, dual_path=False, long_mean=0, tail_first=0, chain=False, even_span=0, narrow=False,
):  # fmt: skip
    """Run _plan_kernel: the planned cut as int32 [4, max_chunks + B] (layout in _plan_kernel's docstring), chunks of
    block_n * 2^k tokens (k < num_cand) of each sequence's visible range, for at most max_chunks chunk slots,
    saturation programs per SM wanted. pdl: let the next kernel launch while this one runs; chain: launched with
    PDL itself, as a call's first kernel (``chain_pdl``). counters: the fused
    combine's int32 arrival counters, zeroed by the planner (None: not fused). dual_path: launched after the
    single pass of a dual-path call (``decode_splitk``), with PDL when pdl, and idle on an even batch (of mean
    visible length < long_mean, if > 0; an even batch of longer ones is cut from sequence tail_first on; even over
    even_span sequences if > 0: ``full_grid_span``). narrow: ``narrow_cut``'s."""
    batch = cache_seqlens.shape[0]
    features = features or Features()
    plan = workspace((4, max_chunks + batch), torch.int32, cache_seqlens.device)
    block_b = next_power_of_2(batch)
    block_i, warps = planner_shape(block_b)
    launch(
        _plan_kernel, (cdiv(max_chunks, block_i),),
        cache_seqlens, plan, plan if counters is None else counters, 0 if counters is None else counters.numel(),
        batch, tail_first, num_kv_heads, max_chunks, cache_seqlens.stride(0),
        int(features.window_left if features.window_left is not None else 0), NUM_SMS=num_sms,
        BLOCK_B=block_b, BLOCK_N=block_n, LOG2_BLOCK_N=block_n.bit_length() - 1,
        NUM_CAND=num_cand, SATURATION=saturation, OVERHEAD=CHUNK_OVERHEAD_TOKENS, BLOCK_I=block_i,
        HAS_WINDOW=features.window_left is not None, Q_LEN=features.q_len, USE_PDL=pdl, num_warps=warps,
        EVEN_B=block_b if dual_path else 0, **({"launch_pdl": True} if pdl and (dual_path or chain) else {}),
        WAVE_SAT=wave_saturation(saturation), LONG_MEAN=long_mean, EVEN_SPAN=even_span, ORDER=PLANNER_ORDER,
        EQUAL=PLANNER_EQUAL, NARROW=narrow,
    )  # fmt: skip
    return plan


@triton.jit
def _zero_counters_kernel(COUNTERS, num_counters, USE_PDL: tl.constexpr, BLOCK: tl.constexpr):
    """The fused merge's int32 arrival counters zeroed, as the call's first kernel, where the partial programs plan in
    place (``INLINE_FUSED_MAX_BATCH``): one program. The partial kernel launches at once and waits for it at its top,
    as it waits for the planner."""
    let_next_start(USE_PDL)
    # the counters are a new workspace: memory the previous call's kernels may still use
    wait_for_previous(USE_PDL)
    for c0 in range(0, num_counters, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        tl.store(COUNTERS + offs, tl.zeros([BLOCK], tl.int32), mask=offs < num_counters)


def launch_zero_counters(counters, pdl: bool, chain: bool) -> None:
    """Run _zero_counters_kernel on counters (int32); pdl, chain: as ``launch_plan``'s."""
    launch(
        _zero_counters_kernel, (1,), counters, counters.numel(), USE_PDL=pdl, BLOCK=1024,
        **({"launch_pdl": True} if pdl and chain else {}),
    )  # fmt: skip


# the in-place plan's arguments of a partial kernel that reads the plan from PLAN instead (constant: no recompiles)
_NO_INLINE_PLAN = dict(
    NUM_SMS=1, INLINE_PLAN=False, BLOCK_B=1, LOG2_BLOCK_N=4, NUM_CAND=1, SATURATION=1, OVERHEAD=0, WAVE_SAT=0
)  # fmt: skip
# ...and of a combine kernel, which also takes the lengths and what the partial kernel has anyway
_NO_COMBINE_PLAN = dict(
    _NO_INLINE_PLAN, SEQLENS=None, tail_first=0, stride_sl=0, num_kv_heads=1, window=0, BLOCK_N=16, HAS_WINDOW=False,
    Q_LEN=1,
)  # fmt: skip


def split_config(
    head_dim: int, group: int, dtype, q_len: int, kv_itemsize: int, num_kv_heads: int, fused: bool,
    long_tile: bool = False, merged_fixed: bool = False,
) -> tuple[dict, int, str]:  # fmt: skip
    """(partial kernel launch config, programs per SM the planner aims at, tile class) for one call's shapes.

    The config is ``launch_config``'s, with SMALL_GROUP_SPLIT_TILE for groups < 4 whose token row (Hkv * D *
    itemsize bytes) is a power of two. ``long_tile`` (from ``plan_decode``, which reads the lengths) asks for the
    long-chunk tile of the shapes' class: an fp8 cache's ``FP8_LONG_TILE`` (which the fused merge takes anyway), the
    "mha" tile's ``mha_long_tile`` or the grouped prefetching tile's ``GROUPED_LONG_TILE`` for fixed splits merged
    in the last split program (merged_fixed), ``GROUPED_MID_TILE`` for others; other classes have none. The planned
    launch caps the partial kernel at the planner's programs per SM (``launcher.cap_programs_per_sm``), whatever its
    registers allow. The planner's target comes from PLANNER_SATURATION by tile class: "deep" (head dims above 128),
    "fp8_long" (``FP8_LONG_TILE``), "grouped" (q_len x group >= 4), "small_group" (the split tile above), "mha" (the
    128-token tile of the other small groups), "mha_long" (``mha_long_tile``), "grouped_long" or "grouped_mid"."""
    long_fp8 = (fused or long_tile) and kv_itemsize == 1
    cfg = launch_config(head_dim, group, dtype, q_len, kv_itemsize, prefetch=not long_fp8)
    row_bytes = num_kv_heads * head_dim * kv_itemsize
    small = bool(SMALL_GROUP_SPLIT_TILE) and q_len * group < 4 and cfg["BLOCK_D"] <= 128
    small = small and row_bytes & (row_bytes - 1) == 0
    if small:
        cfg.update(SMALL_GROUP_SPLIT_TILE)
    tile = "grouped" if q_len * group >= 4 else ("small_group" if small else "mha")
    tile = "deep" if cfg["BLOCK_D"] > 128 else tile
    mha_long = mha_long_tile(cfg["BLOCK_D"], q_len * group) if long_tile and tile == "mha" else None
    if long_fp8 and uses_tile(cfg, FP8_LONG_TILE):
        tile = "fp8_long"
    elif mha_long:
        cfg.update(mha_long)
        tile = "mha_long"
    elif long_tile and tile == "grouped" and GROUPED_LONG_TILE and uses_prefetch_tile(cfg):
        cfg.update(GROUPED_LONG_TILE if merged_fixed else GROUPED_MID_TILE)
        tile = "grouped_long" if merged_fixed else "grouped_mid"
    return cfg, (PLANNER_SATURATION[tile] if PLANNER_SATURATION else SATURATION_PER_SM), tile


def mha_long_tile(block_d: int, rows: int) -> dict | None:
    """The "mha" tile class's long-chunk tile for a head dim padded to block_d and rows query rows a KV head:
    MHA_PREFETCH_TILE for one row at head dim 128, else MHA_LONG_TILE (None: that one is off)."""
    if MHA_PREFETCH_TILE and block_d == 128 and rows == 1:
        return MHA_PREFETCH_TILE
    return MHA_LONG_TILE


@functools.lru_cache(maxsize=256)
def planner_target(head_dim: int, group: int, dtype, q_len: int, kv_itemsize: int, num_kv_heads: int) -> int:
    """The planner's programs per SM for these shapes (``split_config``): with B * Hkv at least that many per SM, a
    uniform batch is never split (halving a chunk doubles the programs), so ``auto`` runs the single pass."""
    return split_config(head_dim, group, dtype, q_len, kv_itemsize, num_kv_heads, False)[1]


@functools.lru_cache(maxsize=256)
def single_pass_tail(
    batch: int, head_dim: int, group: int, dtype, q_len: int, kv_itemsize: int, num_kv_heads: int, num_sms: int,
    max_tokens: int,
) -> tuple[int, int] | None:  # fmt: skip
    """Whether a single pass of these shapes would end on a nearly empty wave: None, or (the first sequence whose
    programs are in that wave, the mean visible length from which an even batch counts as long).

    With P = B * Hkv programs in waves of R * #SMs (R programs per SM, TAIL_WAVES by tile class), a tail is k >= 1
    full waves and a last one filled to at most W - 1 (TAIL_WAVES, mean length TAIL_LONG_TOKENS), or to at most
    TAIL_FULLER - 1 (mean length TAIL_FULLER_TOKENS); 16-bit caches, one query token, TAIL_HEAD_DIMS, a table that can
    hold a sequence that long. The last wave's programs run a few per SM, each at the speed of a lone program, for
    the whole length of a sequence. A dual-path call there runs the single pass alone only for an even batch of
    shorter sequences; an even long one is split (``TAIL_SPLIT``): the single pass takes the sequences before the
    returned one (floor(k * R * #SMs / Hkv), the full waves) and the planned path the rest over the whole GPU;
    anything else goes planned (``decode_splitk``, docs/design.md). Without TAIL_SPLIT: only k = 1, and the planned
    path takes an even long batch whole (first sequence 0)."""
    if q_len != 1 or kv_itemsize != 2 or head_dim not in TAIL_HEAD_DIMS or max_tokens < TAIL_LONG_TOKENS:
        return None
    tile = split_config(head_dim, group, dtype, q_len, kv_itemsize, num_kv_heads, False)[2]
    per_sm, waves = TAIL_WAVES[tile]
    programs, wave = batch * num_kv_heads, per_sm * num_sms
    single = launch_config(head_dim, group, dtype, q_len, kv_itemsize, single=True)
    if uses_prefetch_tile(single) and programs <= PREFETCH_TILE_PER_SM * num_sms:
        # one wave of PREFETCH_TILE_PER_SM programs per SM (single_pass_long_grid); longer grids run in waves of 4
        return None
    full = programs // wave
    if full < 1 or programs == full * wave or (full > 1 and not TAIL_SPLIT):
        return None
    fill = programs / wave - full
    long_tokens = TAIL_LONG_TOKENS
    if fill > waves - 1:
        fuller = (TAIL_FULLER or {}).get(tile)
        if not TAIL_SPLIT or fuller is None or fill > fuller - 1 or max_tokens < TAIL_FULLER_TOKENS:
            return None
        long_tokens = TAIL_FULLER_TOKENS
    return (full * wave // num_kv_heads if TAIL_SPLIT else 0), long_tokens


def full_grid_span(batch: int, num_kv_heads: int, num_sms: int, target: int) -> int:
    """A dual-path call's SPAN for ``even_batch``: 0 (the batch size) below a full grid, else the sequences one wave
    holds, floor(target * #SMs / Hkv) < B (target: the planner's programs per SM, ``planner_target``). A full grid
    runs in waves, longest first (``triton_common.longest_first``), so it suits the single pass unless one program of
    its longest sequence outlasts a wave slot's share of the work, max L * SPAN vs sum L (``even_test``): one long
    sequence among many short ones, which only the planned path can split (``api``'s rule 3, docs/design.md)."""
    span = target * num_sms // num_kv_heads
    return span if span < batch else 0


def dual_path_gates(
    batch: int, head_dim: int, group: int, dtype, q_len: int, kv_itemsize: int, num_kv_heads: int, num_sms: int,
    max_tokens: int,
) -> tuple[tuple[int, int] | None, int]:  # fmt: skip
    """A dual-path call's gates, from shapes: (``single_pass_tail``'s (first sequence, long mean) or None, and
    without a tail ``full_grid_span``'s SPAN for the planner's target, else 0)."""
    shapes = (head_dim, group, dtype, q_len, kv_itemsize, num_kv_heads)
    tail = single_pass_tail(batch, *shapes, num_sms, max_tokens)
    return tail, (0 if tail else full_grid_span(batch, num_kv_heads, num_sms, planner_target(*shapes)))


def merge_in_partial(batch: int, q_len: int, num_q_heads: int, num_kv_heads: int, num_sms: int) -> bool:
    """Whether a planned call merges chunks in the last partial program (``merge_if_last``) rather than in a combine
    launch, from shapes only: enough (sequence, row) pairs that the combine would not be a few long merges
    (B * q_len * Hq >= #SMs), and few chunks expected per sequence: the planner aims at SATURATION_PER_SM * #SMs
    programs, so a uniform batch gets about that / (B * Hkv) chunks each, and the last program merges them at
    ~0.27 us per step of MERGE_UNROLL chunks (docs/design.md)."""
    pairs = batch * q_len * num_q_heads >= num_sms
    return FUSED_COMBINE and pairs and SATURATION_PER_SM * num_sms <= FUSED_EXPECTED_CHUNKS * batch * num_kv_heads


def plans_in_place(
    batch: int, q_len: int, num_q_heads: int, num_kv_heads: int, num_sms: int, fused: bool | None = None
) -> bool:  # fmt: skip
    """Whether a planned call without a host table computes the cut in its partial and combine programs
    (``inline_chunk``) rather than in a planner launch: at most INLINE_PLAN_MAX_BATCH sequences and no fused merge
    (whose counters the planner zeroes; fused: ``merge_in_partial``'s answer where the caller has it)."""
    if not INLINE_PLAN_MAX_BATCH or batch > INLINE_PLAN_MAX_BATCH:
        return False
    return not (merge_in_partial(batch, q_len, num_q_heads, num_kv_heads, num_sms) if fused is None else fused)


def fixed_split_count(splits: int, chunk: int, cfg: dict, programs_per_split: int, num_sms: int) -> int:
    """plan_decode's fixed split count for a cut of ``splits`` chunks of ``chunk`` tokens a sequence
    (FIXED_MIN_SPLIT_TILES): with the measured tile (PREFETCH_TILE), halved while the chunks are shorter than that
    many tiles and the grid keeps a program per SM (programs_per_split: B * Hkv * head blocks)."""
    if not uses_prefetch_tile(cfg):
        return splits
    block_n = cfg["BLOCK_N"]
    while splits > 1 and chunk < FIXED_MIN_SPLIT_TILES * block_n and splits // 2 * programs_per_split >= num_sms:
        splits, chunk = splits // 2, chunk * 2
    return splits


def fixed_cut(
    visible, max_tokens: int, head_dim: int, group: int, dtype, q_len: int, kv_itemsize: int, num_kv_heads: int,
    num_sms: int, long_tile: bool = False,
) -> tuple[dict, int, str, int]:  # fmt: skip
    """The planned cut of these visible lengths as ``decode_splitk`` would make it (the grid, tile and target of
    these shapes, in a table of max_tokens), for fixed splits, which never fuse the merge as a planned call does:
    (tile config, chunk tokens, tile class, programs per SM). ``plan_decode``'s and ``capacity_splits``'s."""
    cfg, saturation, tile = split_config(head_dim, group, dtype, q_len, kv_itemsize, num_kv_heads, False, long_tile)
    block_n = cfg["BLOCK_N"]
    chunk = chunk_size(
        visible, num_kv_heads, num_sms, grid_chunks(len(visible), num_kv_heads, num_sms), block_n,
        num_candidates(max_tokens, block_n), saturation,
    )  # fmt: skip
    return cfg, chunk, tile, saturation


def capacity_splits(
    batch: int, max_tokens: int, head_dim: int, group: int, dtype, q_len: int, kv_itemsize: int, num_kv_heads: int,
    num_sms: int,
) -> int:  # fmt: skip
    """``auto``'s fixed split count for a small table (``api.CAPACITY_SPLITS_MAX_TOKENS``): what ``plan_decode``
    gives a batch whose every sequence fills the table's max_tokens (``fixed_cut``'s chunk count, then
    ``fixed_split_count``), short of its GROUPED_LONG_TILE splits (which merge with a plan's counters). Fixed splits
    deal each sequence's own tiles over them, so shorter sequences get shorter splits."""
    shapes = (head_dim, group, dtype, q_len, kv_itemsize, num_kv_heads, num_sms)
    cfg, chunk, _, _ = fixed_cut([max_tokens] * batch, max_tokens, *shapes)
    head_blocks = cdiv(q_len * group, cfg["BLOCK_H"])
    return fixed_split_count(cdiv(max_tokens, chunk), chunk, cfg, batch * num_kv_heads * head_blocks, num_sms)


def merge_fixed_in_partial(
    batch: int, q_len: int, num_q_heads: int, num_splits: int, num_sms: int, tile: str | None = None
) -> bool:
    """Whether fixed splits should merge in the last split program (``decode_splitk(counters=...)``) rather than in
    a combine launch: few splits a sequence (FIXED_MERGE_MAX_SPLITS) and (sequence, row) pairs for every SM, or
    any number of pairs for the "mha" tile class (``tile``: the class of the cut, ``fixed_cut``'s;
    FIXED_MERGE_MHA_ANY_PAIRS)."""
    few = 1 < num_splits <= FIXED_MERGE_MAX_SPLITS
    pairs = batch * q_len * num_q_heads >= num_sms or (FIXED_MERGE_MHA_ANY_PAIRS and tile == "mha")
    return FUSED_COMBINE and few and pairs


def inline_block_b(batch: int) -> int:
    """The in-place plan's lengths tile: the batch padded to a power of two, but 8 for 3-8 sequences. ptxas gives the
    partial kernel 160-167 registers with a tile of 4 (3 programs per SM instead of 4: 4 x 16384 12/2 took 31.7 us
    against 26.2 with 8); 1, 2, 8 and 16 stay at <= 128 (tests/test_compile_sm90.py). H200, planner launch -> in
    place: 1 x 65536 12/2 27.8 -> 25.9 us, 1 x 2048 28/4 10.9 -> 10.0, 1 x 65536 12/12 104.5 -> 102.6."""
    return next_power_of_2(batch) if batch <= 2 else max(8, next_power_of_2(batch))


def inline_plan_args(batch, num_sms, block_n, num_cand, saturation, narrow=False) -> dict:
    """The partial kernel's arguments for computing the planned cut in place (``inline_chunk``), beside the lengths,
    window and BLOCK_N it takes anyway; narrow: ``narrow_cut``'s."""
    return dict(
        NUM_SMS=num_sms, INLINE_PLAN=True, BLOCK_B=inline_block_b(batch), LOG2_BLOCK_N=block_n.bit_length() - 1,
        NUM_CAND=num_cand, SATURATION=saturation, OVERHEAD=CHUNK_OVERHEAD_TOKENS, WAVE_SAT=wave_saturation(saturation),
        NARROW=narrow,
    )  # fmt: skip


def narrow_cut(batch: int, max_tokens: int, num_kv_heads: int) -> bool:
    """Whether ``_chunk_layout`` may count in int32 (NARROW): B sequences of at most max_tokens (the table's
    capacity) have at most B * max_tokens tokens and chunks, and B * max_tokens * Hkv programs, below 2^31."""
    return bool(NARROW_CUT) and batch * max_tokens * num_kv_heads < 2**31


def launch_combine(
    o_part, lse_part, out, lse, plan, max_chunks, num_splits, sinks=None, deterministic=False, pdl=False,
    num_sms=None, merged_max=1, inline=None, even=None, long_only=False,
):  # fmt: skip
    """Run _combine_kernel over the partials o_part [chunks, q_len * Hq, BLOCK_D] and lse_part [chunks, q_len * Hq]
    (fp32) into out [B, Hq, D] or [B, q_len, Hq, D] and lse (None or contiguous, fp32). num_splits: 0 for the
    planned mode (plan from ``launch_plan``, max_chunks slots), S for fixed splits. sinks: [Hq] fp32 or None.
    deterministic: blocks of COMBINE_BLOCK_S chunks always, so the summation tree does not depend on S. pdl:
    launched with programmatic dependent launch. num_sms: lets a call with few (sequence, row) pairs use the
    COMBINE_WIDE blocks. merged_max (planned mode): sequences of at most this many chunks were written by their
    partial programs (1: single-chunk ones; FUSED_MAX_CHUNKS with the fused merge) and are skipped. In the planned
    mode the combine reads each sequence's (first chunk, count) from the plan's per-sequence columns, which the
    planner wrote; inline (``inline_plan_args`` plus the lengths, for the in-place plan): it computes them from the
    lengths before its PDL wait, overlapping the partial kernel's last programs (H200, perf_probe at 5b7ac97, against
    reading counts the partial programs published: 8 x 2048 28/4 18.9 -> 17.6 us, 16 x 4096 12/2 28.2 -> 26.1,
    16 x 4096 12/12 102.8 -> 100.7; computing them after the wait had cost 1 x 65536 12/2 4 us, probe 4345621).
    even: a dual-path call's EVEN_B and the lengths arguments of ``even_batch`` (the combine is idle on an even
    batch). long_only (planned mode with the fused merge, merged_max > 1): one program per row for each of the at
    most max_chunks // (merged_max + 1) sequences that can have more than merged_max chunks, the k-th program
    finding the k-th such sequence in the plan's counts or its in-place cut, instead of one per sequence
    (``COMBINE_LONG_ONLY``)."""
    out4 = out[:, None] if out.dim() == 3 else out
    batch, q_len, num_q_heads, head_dim = out4.shape
    fixed, block_d = num_splits, o_part.shape[2]
    block_s, d_blocks, small_s = COMBINE_BLOCK_S, COMBINE_D_BLOCKS, 0
    wide = bool(COMBINE_WIDE) and not deterministic and num_sms is not None and batch * q_len * num_q_heads < num_sms
    if wide:
        block_s, d_blocks = COMBINE_WIDE
    elif inline is not None and 0 < COMBINE_INLINE_SMALL_S < block_s:
        small_s = COMBINE_INLINE_SMALL_S
    if block_d % (16 * d_blocks):
        d_blocks = 1
    block_s = min(block_s, next_power_of_2(fixed)) if fixed > 1 and not deterministic else block_s
    one_warp = wide and block_s * (block_d // d_blocks) <= COMBINE_ONE_WARP_MAX
    seqs = batch
    if long_only:
        assert not fixed and merged_max > 1, "long_only: planned mode with the fused merge"
        seqs = max(1, min(batch, max_chunks // (merged_max + 1)))
    launch(
        _combine_kernel, (q_len * num_q_heads, seqs, d_blocks),
        o_part, lse_part, out4, lse if lse is not None else lse_part, plan, sinks if sinks is not None else lse_part,
        batch, max_chunks, num_q_heads, out4.stride(0), out4.stride(1), out4.stride(2),
        NUM_SPLITS=fixed, HEAD_DIM=head_dim, BLOCK_S=block_s, BLOCK_D=block_d, BLOCK_DC=block_d // d_blocks,
        WRITE_LSE=lse is not None, HAS_SINKS=sinks is not None,
        USE_PDL=pdl, MERGED_MAX=merged_max, **{**(inline or _NO_COMBINE_PLAN), **(even or {})},
        LONG_ONLY=next_power_of_2(batch) if long_only else 0, SMALL_S=small_s, num_warps=1 if one_warp else 4,
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip


def decode_splitk(
    q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, out, lse=None, num_splits=None, num_sms=None,
    config=None, return_partials=False, features=None, split_tokens=None, dual_path=False, counters=None,
    long_tile=False, table=None, len_hint=0,
):  # fmt: skip
    """Launch the partial and combine kernels.

    Args: as ``triton_single.decode_single`` (config overrides ``launch_config``; features as there), plus
        num_splits: None for the planned mode, or S >= 1 for S splits per sequence (fixed mode).
        num_sms: SMs to plan for (planned mode); defaults to the device's.
        split_tokens: deterministic mode: splits of this many tokens (a multiple of BLOCK_N); num_splits must be None.
        dual_path: planned mode only. First launch the single pass, whose programs write only if the batch is even
            (``triton_common.even_batch``), then the planned kernels, whose programs return at once on an even
            batch: no host sync, one CUDA graph for both outcomes (docs/design.md, "The `auto` rule"). Where the
            single pass would end on a nearly empty wave (``single_pass_tail``), it takes an even batch whole only
            if its mean visible length is short, and of a longer one the sequences of the full waves.
        return_partials: also return the fp32 partial outputs [chunks, q_len * Hq, BLOCK_D] and LSEs
            [chunks, q_len * Hq], row = token * Hq + head (tests; in the planned mode, single-chunk sequences go
            straight to ``out`` and leave their rows unset). Partials hold no sink (it joins in the combine).
        counters: fixed mode with at most FUSED_MAX_CHUNKS splits: a zeroed int32 tensor of at least B * Hkv * head
            blocks elements, kept zero by the calls. The last split program of each (sequence, KV head, head block)
            then merges the splits (``merge_if_last``) and resets its counter: no combine launch. The calls that
            share it must run one after another (one stream).
        long_tile: the partial kernel takes the long-chunk tile of the shapes' class (``split_config``): an fp8
            cache's ``FP8_LONG_TILE`` (128 tokens, 2 programs per SM) instead of ``FP8_SPLIT_TILE``, the MHA tile's
            ``mha_long_tile`` (3 stages; 32-token tiles with the page ids ahead for one row at head dim 128), the
            grouped prefetching tile's ``GROUPED_LONG_TILE`` (128 tokens, one program per SM) with counters,
            ``GROUPED_MID_TILE`` (64 tokens, two) without; ``plan_decode`` asks for it, from the lengths. Any
            lengths give the right output either way.
        table: planned mode with a cut made on the host (``plan_decode``: ``host_cut`` / ``host_table``), an int32
            [4, chunks + B] tensor on q's device, instead of the planner launch; no window. With counters (zeroed,
            at least B * Hkv * head blocks, at most FUSED_MAX_CHUNKS chunks a sequence in the table) the last
            chunk program of each (sequence, KV head, head block) merges and resets its counter, else a combine
            launch merges.
        len_hint: fixed mode without a window: the length the sequences are expected to have (``plan_decode``'s,
            when all were equal; 0: none). Each split's first page ids are then loaded from where that length puts
            the split, beside the length's load instead of after it (``attend_range``'s EARLY_PAGES); a sequence of
            another length loads them again from its own start. Any lengths give the right output.
    """
    q4, out4 = as_rows(q), as_rows(out)
    batch, q_len, num_q_heads, head_dim = q4.shape
    num_kv_heads, page_size = k_cache.shape[2], k_cache.shape[1]
    group = num_q_heads // num_kv_heads
    features = features or Features()
    assert features.q_len == q_len, f"features.q_len {features.q_len} != q's q_len {q_len}"
    assert num_splits is None or num_splits >= 1, f"num_splits must be None or >= 1, got {num_splits}"
    host = table is not None
    assert not host or (num_splits is None and not dual_path and not split_tokens), "a host table is planned mode"
    assert host or num_splits is not None or batch <= MAX_PLANNED_BATCH, f"planned mode takes B <= {MAX_PLANNED_BATCH}"
    assert lse is None or lse.is_contiguous(), "lse workspace must be contiguous [B, (q_len,) Hq]"
    assert not dual_path or (num_splits is None and not split_tokens), "dual-path calls are planned"
    # the evenness test's lengths tile in every kernel of a dual-path call (0: not one)
    even_b = next_power_of_2(batch) if dual_path else 0
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 16
    max_tokens = block_table.shape[1] * page_size
    # ...and its length gate: where the single pass would end on a nearly empty wave, the planned path takes long
    # batches, of an even one the sequences from tail_first on; or, in a full grid without a tail, the test over the
    # sequences a wave holds (even_batch's SPAN)
    tail, span = None, 0
    if dual_path:
        tail, span = dual_path_gates(
            batch, head_dim, group, q.dtype, q_len, k_cache.element_size(), num_kv_heads, num_sms, max_tokens
        )  # fmt: skip
    tail_first, long_mean = tail or (0, 0)
    if host:
        # the plan decided, from the table: its counters
        fused = counters is not None
    else:
        fused = num_splits is None and not split_tokens
        fused = fused and merge_in_partial(batch, q_len, num_q_heads, num_kv_heads, num_sms)
    # fixed splits merged in the last split program, with the plan's counters
    fused_fixed = bool(num_splits and 1 < num_splits <= FUSED_MAX_CHUNKS) and counters is not None and not split_tokens
    cfg, saturation, tile = split_config(
        head_dim, group, q.dtype, q_len, k_cache.element_size(), num_kv_heads, fused, long_tile, fused_fixed
    )  # fmt: skip
    cfg.update(config or {})
    head_blocks = cdiv(q_len * group, cfg["BLOCK_H"])
    if split_tokens:
        assert num_splits is None and split_tokens % cfg["BLOCK_N"] == 0, f"split_tokens {split_tokens} vs {cfg}"
        num_splits = max(1, cdiv(max_tokens, split_tokens))
    if host:
        chunks, fixed = table.shape[1] - batch, 0
    elif num_splits is None:
        # the tail gate's planned path takes long batches of more than a wave: more slots, a finer cut
        chunks, fixed = grid_chunks(batch, num_kv_heads, num_sms, TAIL_EXTRA_PROGRAMS_PER_SM if long_mean else None), 0
    else:
        chunks, fixed = max(batch * num_splits, FIXED_GRID_SLOTS), num_splits
    num_cand = num_candidates(max_tokens, cfg["BLOCK_N"])
    # the device cut's counting width (fixed splits and host tables make no cut on the device)
    narrow = not (fixed or host) and narrow_cut(batch, max_tokens, num_kv_heads)
    o_part = workspace((chunks, q_len * num_q_heads, cfg["BLOCK_D"]), torch.float32, q.device)
    lse_part = workspace((chunks, q_len * num_q_heads), torch.float32, q.device)
    lse_arg = lse if lse is not None else lse_part
    fargs = features.kernel_args(cache_seqlens)
    # planned mode: the cut, written once by _plan_kernel ([4, slots + B] int32); fixed mode never reads it
    # a dual-path call is not chained to the calls around it: on an even batch its planned kernels end at once, so the
    # next call's programs would be resident (waiting) beside the single pass for its whole run, and slow it down
    # (H200: 64 x 4096 32/8 250 -> 334 us)
    pdl, chain = use_pdl(q.device), chain_pdl(q.device) and not dual_path
    # with the fused merge the combine still runs (for sequences of more than FUSED_MAX_CHUNKS chunks) unless the
    # table cannot hold one
    combine = not fused or (not host and cdiv(max_tokens, cfg["BLOCK_N"]) > FUSED_MAX_CHUNKS)
    if fused_fixed or (host and fused):
        assert counters.dtype == torch.int32 and counters.numel() >= batch * num_kv_heads * head_blocks, "counters"
        combine = False
    else:
        counters = workspace((batch * num_kv_heads * head_blocks,), torch.int32, q.device) if fused else None
    # small batches plan in place; with the fused merge a small kernel zeroes its counters (INLINE_FUSED_MAX_BATCH)
    inline_fused = fused and not (fixed or host or dual_path) and batch <= INLINE_FUSED_MAX_BATCH
    inline = None
    in_place = not (fixed or host) and plans_in_place(batch, q_len, num_q_heads, num_kv_heads, num_sms, fused)
    if inline_fused or in_place:
        inline = inline_plan_args(batch, num_sms, cfg["BLOCK_N"], num_cand, saturation, narrow)
    if dual_path:
        # the single pass first: on an even batch it writes the output and every planned program returns at once
        decode_single(
            q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, out, lse, features=features,
            num_sms=num_sms, even_only=True, long_mean=long_mean, tail_first=tail_first, even_span=span,
            longest_first=bool(span),
        )  # fmt: skip
    if host:
        assert table.dtype == torch.int32 and table.device == q.device and table.shape[0] == 4, "host table"
        plan = table
    elif fixed or inline:
        # no plan in memory: each program computes its part of the cut itself (PLAN is read by no kernel)
        plan = workspace((1,), torch.int32, q.device)
        if inline_fused:
            launch_zero_counters(counters, pdl, chain)
    else:
        plan = launch_plan(
            cache_seqlens, num_kv_heads, num_sms, chunks, cfg["BLOCK_N"], num_cand, saturation, pdl, features,
            counters, dual_path, long_mean, tail_first, chain, span, narrow,
        )  # fmt: skip
    # natural-scale logits when softcap or ALiBi act on them; the kernel goes to log2 units afterwards
    natural = features.softcap is not None or features.alibi_slopes is not None
    # planned grids have at most B + TAIL_EXTRA_PROGRAMS_PER_SM * SMs / Hkv chunk slots (``grid_chunks``), within
    # grid dim 1's 65535; fixed ones (B * S) may not
    heads_first = tile in PARTIAL_HEADS_FIRST and (FIXED_HEADS_FIRST or not fixed)
    grid = (num_kv_heads * head_blocks, chunks) if heads_first else (chunks, num_kv_heads * head_blocks)
    launch(
        _partial_kernel, grid,
        q4, k_cache, v_cache, cache_seqlens, block_table, plan, plan if counters is None else counters, o_part,
        lse_part, out4, lse_arg,
        qk_scale=softmax_scale * (1.0 if natural else LOG2E), num_q_heads=num_q_heads, batch=batch,
        tail_first=tail_first, max_chunks=chunks,
        stride_qb=q4.stride(0), stride_qt=q4.stride(1), stride_qh=q4.stride(2),
        stride_kp=k_cache.stride(0), stride_kt=k_cache.stride(1), stride_kh=k_cache.stride(2),
        stride_vp=v_cache.stride(0), stride_vt=v_cache.stride(1), stride_vh=v_cache.stride(2),
        stride_sl=cache_seqlens.stride(0), stride_btb=block_table.stride(0), stride_btp=block_table.stride(1),
        stride_ob=out4.stride(0), stride_ot=out4.stride(1), stride_oh=out4.stride(2),
        NUM_SPLITS=fixed, SPLIT_TOKENS=split_tokens or 0, GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        DOT_F32=dot_in_fp32(q.dtype), WRITE_LSE=lse is not None, HEAD_BLOCKS=head_blocks, HEADS_FIRST=heads_first,
        USE_PDL=pdl, FUSED_MAX=FUSED_MAX_CHUNKS if fused or fused_fixed else 0, MERGE_UNROLL=MERGE_UNROLL,
        **(inline or _NO_INLINE_PLAN),
        **fargs, **cfg,
        # a call's first kernel when chained; else after the planner, the counters' zeroing kernel or the single pass
        **({"launch_pdl": True} if pdl and (chain or dual_path or inline_fused or not (fixed or inline or host))
           else {}),
        EVEN_B=even_b, LONG_MEAN=long_mean, EVEN_SPAN=span, OFFS_I32=cache_offsets_fit_int32(k_cache, v_cache),
        V_T=v_token_major(v_cache), LAST=not combine, HOST_TABLE=host, EQUAL=bool(inline) and PLANNER_EQUAL,
        INLINE_EXIT=bool(inline) and INLINE_EXIT and not heads_first,
        table_tokens=block_table.shape[1] * page_size, len_hint=len_hint,
        EARLY_PAGES=pages_before_lengths(cfg, features) and bool(fixed) and len_hint > 0 and not split_tokens,
        # the planned grid's unused slots would let ptxas's spare registers pile its programs onto fewer SMs; fixed
        # splits keep their tile's occupancy (tile_programs_per_sm)
        programs_per_sm=tile_programs_per_sm(cfg) if fixed else saturation,
    )  # fmt: skip
    if combine:
        # the lengths arguments the combine needs to plan in place or to take the evenness test
        lengths = dict(
            SEQLENS=cache_seqlens, tail_first=tail_first, stride_sl=cache_seqlens.stride(0), window=fargs["window"],
            HAS_WINDOW=fargs["HAS_WINDOW"], Q_LEN=q_len,
        )  # fmt: skip
        combine_plan = dict(inline, **lengths, num_kv_heads=num_kv_heads, BLOCK_N=cfg["BLOCK_N"]) if inline else None
        launch_combine(
            o_part, lse_part, out4, lse, plan, chunks, fixed, sinks=features.sinks, deterministic=bool(split_tokens),
            pdl=pdl, num_sms=num_sms, merged_max=FUSED_MAX_CHUNKS if fused else 1, inline=combine_plan,
            even=dict(lengths, EVEN_B=even_b, LONG_MEAN=long_mean, EVEN_SPAN=span) if dual_path else None,
            long_only=COMBINE_LONG_ONLY and fused,
        )  # fmt: skip
    if return_partials:
        return out, lse, o_part, lse_part
    return out, lse


def splitk_partials_mirror(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, chunks):
    """PyTorch float64 mirror of the partial kernel: each chunk's (o_c, lse_c) for the given
    [(sequence, start, end), ...] (from ``chunk_plan`` or ``split_bounds``).

    Returns o_part [chunks, Hq, D] and lse_part [chunks, Hq] float64 on the CPU; empty chunks are (0, -inf).
    """
    from .reference import reference_dense

    num_q_heads, head_dim = q.shape[1], q.shape[2]
    page_size = k_cache.shape[1]
    o_part = torch.zeros(len(chunks), num_q_heads, head_dim, dtype=torch.float64)
    lse_part = torch.full((len(chunks), num_q_heads), -math.inf, dtype=torch.float64)
    table = block_table.cpu().long()
    # each chunk's tokens as a sequence of its own, over a view of the cache as pages of one token
    flat_k = k_cache.reshape(-1, 1, *k_cache.shape[2:])
    flat_v = v_cache.reshape(-1, 1, *v_cache.shape[2:])
    for c, (b, start, end) in enumerate(chunks):
        if start == end:
            continue
        tokens = torch.arange(start, end)
        pages = table[b, tokens // page_size] * page_size + tokens % page_size
        o, lse = reference_dense(q[b : b + 1], flat_k, flat_v, torch.tensor([end - start]), pages[None], softmax_scale)
        o_part[c], lse_part[c] = o[0], lse[0]
    return o_part, lse_part
