"""Split-K paged decode attention (flash-decoding): partial kernel + LSE combine kernel, planned on the device.

The work is cut into *chunks*: contiguous token ranges of one sequence, on BLOCK_N-tile edges. The partial kernel,
one program per (chunk slot, KV head), runs the online softmax over its chunk for the whole GQA group and writes the
normalised partial output o_c = acc_c / l_c (fp32) and its natural-log LSE lse_c = m_c + log(l_c). The combine
kernel, one program per (query head, sequence), merges the sequence's chunks:

    LSE = log(sum_c exp(lse_c)),    out = sum_c exp(lse_c - LSE) * o_c

Each partial is weighted exactly once by its softmax mass exp(lse_c) = l_c * exp(m_c). (The combine published with
the source blog post stores acc_c unnormalised and multiplies by l_c again, weighting each chunk by l_c twice.)

Two ways to cut, one kernel:

* planned (``num_splits=None``): every partial program derives the same cut from the B lengths, with no planner
  launch (``plan_sizes``, ``planned_chunk``). Sequence b owns S chunk slots, S = floor(target / (B * Hkv)) from the
  shapes, target = (programs per SM for the tile, ``split_config``) x #SMs, one program each. Chunks hold
  c ~ T / (S * B) tiles, T the batch's tiles, so a uniform batch fills its S slots each when S divides its tiles (a
  regular slot needs only its own length). Sequences longer than S chunks are cut into chunks sized so that their
  chunks past S (overflow chunks, numbered in sequence order by a prefix sum) fit X = B * S / OVERFLOW_RATIO
  overflow programs, which come first in the grid: one long sequence among short ones starts first and spreads over
  the GPU. The grid (``plan_grid``) is sized from B, Hkv and the SM count, never from the cache's capacity, and read
  by no host code, so one CUDA graph serves every length. A sequence of one chunk is written straight to the output
  by its partial program.
* fixed (``num_splits=S``): each sequence is cut into S pieces of its own length (some may be empty: they write
  (0, -inf)); chunk b * S + s is split s of sequence b. Grid (B * S, Hkv).
* deterministic (``split_tokens=T``): the fixed mode with split s of every sequence covering tokens
  [s * T, (s + 1) * T) of its visible range: boundaries depend on the sequence's own length only, and
  S = ceil(table capacity / T) slots per sequence (the empty ones add exact zeros in the combine, whose blocks and
  order never change), so a sequence's output is bit-identical whatever else is in the batch. The grid is sized
  from the table's capacity: the price of the guarantee (docs/design.md).

Bytes: the visible K/V once per head block (one block unless q_len x group exceeds BLOCK_H), plus
2 * chunks * q_len * Hq * (D + 1) * 4 for the fp32 partials of multi-chunk sequences. With a sliding window both
modes cut only the visible tokens [window start, L), so pages before the window are never read.
Grids: partial (Hkv * head blocks, chunk slots); combine (q_len * Hq / rows per program, B, head-dim blocks), chained
to the partial kernel by programmatic dependent launch.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .triton_common import (
    LOG2E,
    Features,
    attend_group,
    cdiv,
    dot_in_fp32,
    group_rows,
    launch_config,
    let_next_start,
    next_power_of_2,
    store_group,
    use_pdl,
    wait_for_previous,
    window_start,
    window_starts,
)
from .triton_single import as_rows

__all__ = [
    "decode_splitk", "split_config", "plan_grid", "slot_plan", "split_bounds", "splitk_partials_mirror",
]  # fmt: skip

# a batch whose B * Hkv programs give every SM this many runs single-pass under "auto" (api._choose_backend); also
# the planner's target for every tile when PLANNER_SATURATION is None
SATURATION_PER_SM = 4
# programs per SM the planned cut aims at, by partial tile (``split_config``). H200, fixed splits at 5c9ac48 and
# 4345621 (scripts/perf_probe.py, graph µs):
# "mha": the 128-token, 2-stage tile of groups < 4, of which 3 fit an SM: 12/12 rows with 384 programs 97.5-98.3, with
#   768 100.5-103.2;
# "small_group": SMALL_GROUP_SPLIT_TILE: 1 x 8192 32/32 with 512 programs 38.6, 256: 47.6; 1 x 32768 128.3, 165.2;
# "grouped": groups >= 4: 8 x 2048 28/4 with 256 programs 14.7, 512: 14.8; 16 x 4096 12/2 256: 23.9, 512: 23.6
PLANNER_SATURATION = dict(mha=3, small_group=4, grouped=4)
# the planned cut keeps every length of the batch in registers ([BLOCK_B]); above this batch the single-pass grid
# is full anyway
MAX_PLANNED_BATCH = 512
# the combine kernel reads a sequence's own chunks in blocks of at most this many (next_power_of_2(S) when fewer)...
COMBINE_BLOCK_S = 64
# ...for up to COMBINE_MAX_ROWS query rows per program (fewer CTAs when every sequence is one chunk: 256 x 256 12/2
# 4.1 -> 1.2 us with 16 rows, but a long sequence's overflow chunks then merge in narrower blocks), within
# COMBINE_TILE fp32 elements of partials per load; overflow chunks in the widest block that fits the tile
COMBINE_MAX_ROWS = 4
COMBINE_TILE = 8192
# the combine splits the head dim over this many programs
COMBINE_D_BLOCKS = 1
# when B * Hq < #SMs (few (sequence, head) pairs, each merging many chunks) the combine instead reads
# COMBINE_WIDE = (chunks per block, head-dim blocks): one wide load instead of a chain of four dependent ones.
# H200, 12/2 rows: 1 x 65536 32.3 -> 27.8 us, 1 x 131072 49.3 -> 43.9 us; other rows unchanged (None: off)
COMBINE_WIDE = (256, 4)
# partial tile for groups < 4 in split-K when a token row (Hkv * D * itemsize bytes) is a power of two; None: off.
# H200, one 32k sequence, group 1: Hkv 8 / 16 / 32: 47.8 -> 42.4, 86.3 -> 72.8, 162.3 -> 134.4 us, but Hkv 12 / 24:
# 61.1 -> 66.0, 105.4 -> 119.4 us (docs/design.md; the mechanism is not established, so the rule is the measurement)
SMALL_GROUP_SPLIT_TILE = dict(BLOCK_N=64, num_stages=3)
# planned partial grid (Hkv * head blocks, chunk slots): the KV heads of one chunk are dispatched together, as in the
# single pass, and the overflow slots (empty for uniform batches) come last. False: (slots, Hkv * head blocks)
PARTIAL_HEADS_FIRST = True
# planned mode: one overflow program (first in the grid) per this many regular ones; overflow chunks are sized to fit
# (plan_sizes), so a long sequence's chunks past its S slots are up to about this many times a regular chunk
OVERFLOW_RATIO = 4
# deterministic mode: tokens per split, a multiple of every BLOCK_N (long sequences still spread over the SMs)
DETERMINISTIC_SPLIT_TOKENS = 1024


@triton.jit
def batch_tiles(
    SEQLENS, stride_sl, batch, window, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr,
    Q_LEN: tl.constexpr,
):  # fmt: skip
    """(tiles [BLOCK_B], lengths [BLOCK_B], offs_b) of the batch: BLOCK_N-tiles of each visible range (a sliding
    window's first token on), 0 past B."""
    offs_b = tl.arange(0, BLOCK_B)
    lens = tl.load(SEQLENS + offs_b * stride_sl, mask=offs_b < batch, other=0)
    return tl.cdiv(lens - window_starts(lens, window, HAS_WINDOW, Q_LEN), BLOCK_N), lens, offs_b


@triton.jit
def chunk_tiles(tiles, per_chunk, over_chunk, slots_per_seq):
    """Tiles per chunk of a sequence of ``tiles`` tiles: per_chunk, or over_chunk if it needs more than S chunks."""
    return tl.where(tiles > slots_per_seq * per_chunk, over_chunk, per_chunk)


@triton.jit
def overflow_counts(tiles, per_chunk, over_chunk, slots_per_seq, live):
    """[BLOCK_B] overflow chunks of each sequence (those past its S slots), 0 where not ``live``."""
    count = tl.cdiv(tiles, chunk_tiles(tiles, per_chunk, over_chunk, slots_per_seq))
    return tl.where(live, tl.maximum(count - slots_per_seq, 0), 0)


@triton.jit
def plan_sizes(
    SEQLENS, stride_sl, batch, slots_per_seq, overflow_slots, window, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, Q_LEN: tl.constexpr,
):  # fmt: skip
    """The planned cut's chunk sizes, identical in every program and in ``slot_plan``: (per_chunk, over_chunk).

    With T = sum_b ceil(L_b / BLOCK_N) tiles over the visible lengths, chunks hold per_chunk = max(ceil(T / (S * B)),
    1) tiles (S = slots_per_seq), snapped up to ceil(t_max / max(t_max // per_chunk, 1)) so that the longest sequence
    (t_max tiles) divides evenly: a uniform batch fills its S slots each when S divides its tiles. The K sequences
    longer than S * per_chunk tiles (V tiles in all) are cut into chunks of over_chunk = ceil(V / (X + K * (S - 1)))
    tiles instead, X = overflow_slots, so that their chunks past S, the overflow chunks, number fewer than X
    (sum ceil(t_b / over_chunk) < V / over_chunk + K <= X + K * S)."""
    tiles, _, offs_b = batch_tiles(SEQLENS, stride_sl, batch, window, BLOCK_B, BLOCK_N, HAS_WINDOW, Q_LEN)
    # T < 2^31 tiles: a cache of 2^35 tokens
    per_chunk = tl.maximum(tl.cdiv(tl.sum(tiles, axis=0), batch * slots_per_seq), 1)
    longest = tl.max(tiles, axis=0)
    per_chunk = tl.maximum(tl.cdiv(longest, tl.maximum(longest // per_chunk, 1)), 1)
    long_seq = tiles > slots_per_seq * per_chunk
    num_long = tl.sum(long_seq.to(tl.int32), axis=0)
    long_tiles = tl.sum(tl.where(long_seq, tiles, 0), axis=0)
    over_chunk = tl.maximum(tl.cdiv(long_tiles, tl.maximum(overflow_slots + num_long * (slots_per_seq - 1), 1)), 1)
    return per_chunk, over_chunk


@triton.jit
def planned_chunk(
    SEQLENS, CHUNKS, stride_sl, slot, publish, batch, slots_per_seq, overflow_slots, window,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr, Q_LEN: tl.constexpr,
):  # fmt: skip
    """Planned mode: (seq, seqlen, start, end, count) of program ``slot``; seq = B marks an unused slot, count is the
    sequence's number of chunks. The partial row of the result is ``slot`` too.

    The X = overflow_slots programs come first: program j < X runs overflow chunk j, if there is one (the long
    sequences' chunks past their S, in sequence order: a prefix sum over the batch), so the longest work starts
    first. Program X + b * S + s runs chunk s < S of sequence b, which needs only its own length. publish: the
    program also writes its sequence's (chunk count, first overflow chunk) to CHUNKS [2, B] for the combine, if it
    holds the sequence's chunk 0 (callers pass True for one KV head only)."""
    per_chunk, over_chunk = plan_sizes(
        SEQLENS, stride_sl, batch, slots_per_seq, overflow_slots, window, BLOCK_B, BLOCK_N, HAS_WINDOW, Q_LEN
    )
    if slot >= overflow_slots:
        seq = (slot - overflow_slots) // slots_per_seq
        split = slot - overflow_slots - seq * slots_per_seq
        seqlen = tl.load(SEQLENS + seq * stride_sl)
    else:
        tiles, lens, offs_b = batch_tiles(SEQLENS, stride_sl, batch, window, BLOCK_B, BLOCK_N, HAS_WINDOW, Q_LEN)
        extra = overflow_counts(tiles, per_chunk, over_chunk, slots_per_seq, offs_b < batch)
        incl = tl.cumsum(extra, axis=0)
        # the first sequence whose overflow chunks reach past `slot` (B or more past the last one: unused)
        seq = tl.sum((incl <= slot).to(tl.int32), axis=0)
        pick = offs_b == seq
        split = slots_per_seq + slot - tl.sum(tl.where(pick, incl - extra, 0), axis=0)
        seqlen = tl.sum(tl.where(pick, lens, 0), axis=0)
    first = window_start(seqlen, window, HAS_WINDOW, Q_LEN)
    size = chunk_tiles(tl.cdiv(seqlen - first, BLOCK_N), per_chunk, over_chunk, slots_per_seq)
    count = tl.maximum(tl.cdiv(tl.cdiv(seqlen - first, BLOCK_N), size), 1)
    if publish & (split == 0) & (slot >= overflow_slots):
        tiles, _, offs_b = batch_tiles(SEQLENS, stride_sl, batch, window, BLOCK_B, BLOCK_N, HAS_WINDOW, Q_LEN)
        tl.store(CHUNKS + seq, count)
        tl.store(CHUNKS + batch + seq, tl.sum(overflow_counts(tiles, per_chunk, over_chunk, slots_per_seq,
                                                              offs_b < seq), axis=0))  # fmt: skip
    start = first + split * size * BLOCK_N
    end = tl.minimum(start + size * BLOCK_N, seqlen)
    seq = tl.where((seq < batch) & (split < count), seq, batch)
    return seq, seqlen, start, end, count


@triton.jit
def fixed_chunk(
    SEQLENS, stride_sl, chunk_id, window, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_TOKENS: tl.constexpr = 0, HAS_WINDOW: tl.constexpr = False, Q_LEN: tl.constexpr = 1,
):  # fmt: skip
    """Fixed mode: (seq, seqlen, start, end) of chunk chunk_id = split s of sequence b, boundaries on BLOCK_N-tile
    edges of the sequence's own visible range (the rule of ``split_bounds``); SPLIT_TOKENS > 0 (deterministic
    mode): splits of that many tokens."""
    seq = chunk_id // NUM_SPLITS
    seqlen = tl.load(SEQLENS + seq * stride_sl)
    first = window_start(seqlen, window, HAS_WINDOW, Q_LEN)
    if SPLIT_TOKENS > 0:
        tiles_per_split = SPLIT_TOKENS // BLOCK_N
    else:
        tiles_per_split = tl.cdiv(tl.cdiv(seqlen - first, BLOCK_N), NUM_SPLITS)
    start = first + (chunk_id % NUM_SPLITS) * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, seqlen)
    return seq, seqlen, start, end


@triton.jit
def locate_chunk(
    SEQLENS, CHUNKS, stride_sl, chunk_id, publish, batch, slots_per_seq, overflow_slots, window,
    NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_TOKENS: tl.constexpr = 0, BLOCK_B: tl.constexpr = 1,
    HAS_WINDOW: tl.constexpr = False, Q_LEN: tl.constexpr = 1,
):  # fmt: skip
    """The chunk of partial program chunk_id, in either mode: (seq, seqlen, start, end, single); its partial row is
    chunk_id. In the planned mode (NUM_SPLITS == 0, ``planned_chunk``, which also publishes the chunk counts) an
    unused program has seq >= B (the caller returns); single: the chunk is its whole sequence (its program writes the
    output)."""
    if NUM_SPLITS > 0:
        seq, seqlen, start, end = fixed_chunk(
            SEQLENS, stride_sl, chunk_id, window, NUM_SPLITS, BLOCK_N, SPLIT_TOKENS, HAS_WINDOW, Q_LEN
        )
        # one split per sequence: no combine is launched
        return seq, seqlen, start, end, NUM_SPLITS == 1
    seq, seqlen, start, end, count = planned_chunk(
        SEQLENS, CHUNKS, stride_sl, chunk_id, publish, batch, slots_per_seq, overflow_slots, window,
        BLOCK_B, BLOCK_N, HAS_WINDOW, Q_LEN,
    )  # fmt: skip
    return seq, seqlen, start, end, count == 1


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
def _partial_kernel(
    Q,
    K,
    V,
    SEQLENS,
    BLOCK_TABLE,
    CHUNKS,
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
    slots_per_seq,
    overflow_slots,
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
    BLOCK_B: tl.constexpr,
):
    # HEADS_FIRST: grid (Hkv * head blocks, chunk slots), so that programs dispatched together read the heads of the
    # same token rows and the overflow slots come last; else (chunk slots, Hkv * head blocks)
    if HEADS_FIRST:
        chunk_id = tl.program_id(1)
        head_id = tl.program_id(0)
    else:
        chunk_id = tl.program_id(0)
        head_id = tl.program_id(1)
    kv_head = head_id // HEAD_BLOCKS
    head_block = head_id % HEAD_BLOCKS
    # the combine, launched behind this kernel with PDL, may be scheduled now; it waits for this grid to finish
    let_next_start(USE_PDL)

    seq, seqlen, start, end, single = locate_chunk(
        SEQLENS, CHUNKS, stride_sl, chunk_id, head_id == 0, batch, slots_per_seq, overflow_slots, window,
        NUM_SPLITS, BLOCK_N, SPLIT_TOKENS, BLOCK_B, HAS_WINDOW, Q_LEN,
    )  # fmt: skip
    if seq >= batch:
        return
    seq = seq.to(tl.int64)
    out, lse = attend_group(
        Q, K, V, BLOCK_TABLE + seq * stride_btb, seq, kv_head, head_block, seqlen, start, end, qk_scale,
        stride_qb, stride_qt, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_btp,
        ALIBI, K_SCALE, V_SCALE, softcap, window,
        GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_H, BLOCK_N, BLOCK_D, DOT_F32, USE_DOT,
        HAS_SOFTCAP, HAS_ALIBI, HAS_WINDOW, Q_LEN, KV_FP8, SCALE_PTR, PREFETCH_PAGES,
    )  # fmt: skip
    store_chunk(
        O_PART, LSE_PART, OUT, LSE, SINKS, chunk_id, seq, kv_head, head_block, out, lse, single,
        stride_ob, stride_ot, stride_oh, num_q_heads,
        GROUP, HEAD_DIM, BLOCK_H, BLOCK_D, WRITE_LSE, HAS_SINKS, Q_LEN,
    )  # fmt: skip


@triton.jit
def merge_chunks(
    m_i, l_i, acc, O_PART, LSE_PART, slot, mask_s, offs_r, mask_r, offs_d, num_rows, BLOCK_D: tl.constexpr
):  # fmt: skip
    """One step of the combine's online softmax over chunk LSEs (natural log): the partials of the chunks at partial
    rows ``slot`` [BLOCK_S] (``mask_s``) for query rows offs_r [BLOCK_R] (``mask_r``) and head-dim columns offs_d,
    merged into the running max m_i, sum l_i [BLOCK_R] and weighted output acc [BLOCK_R, BLOCK_DC]."""
    # [BLOCK_S, BLOCK_R] partial rows; empty chunks hold -inf
    rows = slot.to(tl.int64)[:, None] * num_rows + offs_r[None, :]
    mask_sr = mask_s[:, None] & mask_r[None, :]
    lse_s = tl.load(LSE_PART + rows, mask=mask_sr, other=float("-inf"))
    m_new = tl.maximum(m_i, tl.max(lse_s, axis=0))
    # while every chunk so far is empty, measure from 0 so that exp(-inf - 0) = 0 rather than NaN
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_ref)
    w = tl.exp(lse_s - m_ref[None, :])
    # [BLOCK_S, BLOCK_R, BLOCK_DC]
    o = tl.load(O_PART + rows[:, :, None] * BLOCK_D + offs_d[None, None, :], mask=mask_sr[:, :, None], other=0.0)
    return m_new, l_i * alpha + tl.sum(w, axis=0), acc * alpha[:, None] + tl.sum(w[:, :, None] * o, axis=0)


@triton.jit
def _combine_kernel(
    O_PART,
    LSE_PART,
    OUT,
    LSE,
    CHUNKS,
    SINKS,
    batch,
    slots_per_seq,
    overflow_slots,
    num_rows,
    num_q_heads,
    stride_ob,
    stride_ot,
    stride_oh,
    NUM_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_SO: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DC: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # one program per (BLOCK_R query rows, row = token * Hq + head; sequence; block of BLOCK_DC head-dim columns)
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = offs_r < num_rows
    seq = tl.program_id(1)
    d0 = tl.program_id(2) * BLOCK_DC
    wait_for_previous(USE_PDL)
    if NUM_SPLITS > 0:
        count = NUM_SPLITS
        over_first = 0
    else:
        # published by the program of the sequence's chunk 0 (planned_chunk); overflow chunk j is at partial row j
        count = tl.load(CHUNKS + seq)
        over_first = tl.load(CHUNKS + batch + seq)
        if count == 1:
            # written by its partial program
            return
    offs_d = d0 + tl.arange(0, BLOCK_DC)

    # the online softmax again, over the chunks' LSEs, per row: running max, sum and weighted output
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DC], tl.float32)
    if HAS_SINKS:
        # the sink is one more "chunk" of mass exp(sink) and output 0, counted once per row
        m_i = tl.load(SINKS + offs_r % num_q_heads, mask=mask_r, other=float("-inf"))
        l_i = tl.where(mask_r, 1.0, 0.0)
    # the sequence's own S slots, in blocks of BLOCK_S (next_power_of_2(S): one block, usually)...
    own = tl.minimum(count, slots_per_seq)
    for s0 in range(0, own, BLOCK_S):
        split = s0 + tl.arange(0, BLOCK_S)
        m_i, l_i, acc = merge_chunks(
            m_i, l_i, acc, O_PART, LSE_PART, overflow_slots + seq * slots_per_seq + split, split < own, offs_r, mask_r,
            offs_d,
            num_rows, BLOCK_D,
        )  # fmt: skip
    # ...then its overflow chunks (planned mode, sequences longer than S chunks), in wide blocks
    over_rows = over_first
    for s0 in range(0, count - own, BLOCK_SO):
        split = s0 + tl.arange(0, BLOCK_SO)
        m_i, l_i, acc = merge_chunks(
            m_i, l_i, acc, O_PART, LSE_PART, over_rows + split, split < count - own, offs_r, mask_r, offs_d,
            num_rows, BLOCK_D,
        )  # fmt: skip

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    seq = seq.to(tl.int64)
    tok = (offs_r // num_q_heads).to(tl.int64)
    head = (offs_r % num_q_heads).to(tl.int64)
    out_ptrs = OUT + seq * stride_ob + (tok * stride_ot + head * stride_oh)[:, None] + offs_d[None, :]
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=mask_r[:, None] & (offs_d < HEAD_DIM)[None, :])
    if WRITE_LSE and d0 == 0:
        lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
        tl.store(LSE + seq * num_rows + offs_r, lse, mask=mask_r)


def plan_grid(batch: int, num_kv_heads: int, target: int) -> tuple[int, int]:
    """(chunk slots per sequence S, overflow programs X) of the planned mode for about ``target`` programs: a grid of
    X + B * S programs per KV head (and head block), one partial row each.

    S = max(floor(target / (B * Hkv)), 1), rounded down so that a uniform batch fills its slots (when S divides its
    tiles): no empty program among busy ones (the block scheduler deals empty programs out like real work:
    64 x 3064 32/8 with S = 2 and one chunk each took 199 us against 183 for the same chunks without the holes).
    X = ceil(B * S / OVERFLOW_RATIO) overflow programs (none for one sequence, which never overflows) come first in
    the grid: the long sequences' extra chunks start before everything else, and for a uniform batch the X empty
    ones leave at once instead of queueing behind the busy ones at the end (2-4 us on the 12/2 and 28/4 rows). Sized
    from B, Hkv and the SM count, never from the cache's capacity."""
    slots_per_seq = max(1, target // (batch * num_kv_heads))
    return slots_per_seq, (cdiv(batch * slots_per_seq, OVERFLOW_RATIO) if batch > 1 else 0)


def visible_start(seqlen: int, window_left: int | None, q_len: int = 1) -> int:
    """First token any query row can see (``triton_common.window_start``): 0 without a window."""
    return 0 if window_left is None else max(seqlen - q_len - window_left, 0)


def split_bounds(
    seqlen: int, num_splits: int, block_n: int, first: int = 0, split_tokens: int = 0
) -> list[tuple[int, int]]:
    """Fixed (and deterministic, split_tokens > 0) mode: [start, end) of each split of one sequence's visible tokens
    [first, seqlen), exactly as the partial kernel computes them."""
    if split_tokens:
        tiles_per_split = split_tokens // block_n
    else:
        tiles_per_split = cdiv(cdiv(seqlen - first, block_n), num_splits)
    bounds = []
    for split in range(num_splits):
        start = first + split * tiles_per_split * block_n
        bounds.append((start, max(start, min(start + tiles_per_split * block_n, seqlen))))
    return bounds


def slot_plan(
    seqlens, slots_per_seq, overflow_slots, block_n, window_left=None, q_len=1
) -> list[tuple[int, int, int] | None]:  # fmt: skip
    """Planned mode: (sequence, start, end) of every program's chunk (overflow programs first, then the regular
    slots), None for an unused one, exactly as ``plan_sizes`` and ``planned_chunk`` cut (over each sequence's
    visible tokens)."""
    batch, s_, x_ = len(seqlens), slots_per_seq, overflow_slots
    firsts = [visible_start(n, window_left, q_len) for n in seqlens]
    tiles = [cdiv(n - f, block_n) for n, f in zip(seqlens, firsts)]
    per_chunk = max(cdiv(sum(tiles), batch * s_), 1)
    longest = max(tiles, default=0)
    per_chunk = max(cdiv(longest, max(longest // per_chunk, 1)), 1)
    long_tiles = [t for t in tiles if t > s_ * per_chunk]
    over_chunk = max(cdiv(sum(long_tiles), max(x_ + len(long_tiles) * (s_ - 1), 1)), 1)
    plan = [None] * (x_ + batch * s_)
    over = 0
    for b, (n, f, t) in enumerate(zip(seqlens, firsts, tiles)):
        size = over_chunk if t > s_ * per_chunk else per_chunk
        count = max(cdiv(t, size), 1)
        for s in range(count):
            row = x_ + b * s_ + s if s < s_ else over + s - s_
            start = f + s * size * block_n
            plan[row] = (b, start, min(start + size * block_n, n))
        over += max(count - s_, 0)
    return plan


def split_config(
    head_dim: int, group: int, dtype, q_len: int, kv_itemsize: int, num_kv_heads: int
) -> tuple[dict, int]:  # fmt: skip
    """(partial kernel launch config, programs per SM the planned cut aims at) for one call's shapes.

    The config is ``launch_config``'s, with SMALL_GROUP_SPLIT_TILE for groups < 4 whose token row
    (Hkv * D * itemsize bytes) is a power of two. The target comes from PLANNER_SATURATION by tile: "grouped"
    (q_len x group >= 4), "small_group" (the split tile above) or "mha" (the 128-token tile of the other small
    groups)."""
    cfg = launch_config(head_dim, group, dtype, q_len, kv_itemsize)
    row_bytes = num_kv_heads * head_dim * kv_itemsize
    small = bool(SMALL_GROUP_SPLIT_TILE) and q_len * group < 4 and cfg["BLOCK_D"] <= 128
    small = small and row_bytes & (row_bytes - 1) == 0
    if small:
        cfg.update(SMALL_GROUP_SPLIT_TILE)
    tile = "grouped" if q_len * group >= 4 else ("small_group" if small else "mha")
    return cfg, (PLANNER_SATURATION[tile] if PLANNER_SATURATION else SATURATION_PER_SM)


def launch_combine(
    o_part, lse_part, out, lse, chunk_counts, slots_per_seq, num_splits, sinks=None, deterministic=False, pdl=False,
    num_sms=None, overflow_slots=0,
):  # fmt: skip
    """Run _combine_kernel over the partials o_part [slots, q_len * Hq, BLOCK_D] and lse_part [slots, q_len * Hq]
    (fp32) into out [B, Hq, D] or [B, q_len, Hq, D] and lse (None or contiguous, fp32). num_splits: 0 for the
    planned mode (chunk_counts: the int32 [2, B] the partial programs published; overflow_slots: X, the overflow
    programs' rows before the regular ones), S for fixed splits; slots_per_seq: S either way. sinks: [Hq] fp32 or None. deterministic: blocks of COMBINE_BLOCK_S chunks always, so
    the summation tree does not depend on S. pdl: launched with programmatic dependent launch. num_sms: lets a call
    with few (sequence, row) pairs use the COMBINE_WIDE blocks, and sets how many rows a program merges.

    Shape: a sequence's own chunks in blocks of next_power_of_2(S) (at most COMBINE_BLOCK_S), BLOCK_R rows per
    program while the [BLOCK_S, BLOCK_R, BLOCK_DC] tile stays within COMBINE_TILE elements and the grid keeps about
    one program per SM, and overflow chunks in blocks of BLOCK_SO, the most that fit the tile."""
    out4 = out[:, None] if out.dim() == 3 else out
    batch, q_len, num_q_heads, head_dim = out4.shape
    num_rows, block_d = q_len * num_q_heads, o_part.shape[2]
    block_s, d_blocks = min(COMBINE_BLOCK_S, next_power_of_2(slots_per_seq)), COMBINE_D_BLOCKS
    if deterministic:
        block_s = COMBINE_BLOCK_S
    elif COMBINE_WIDE and num_sms is not None and batch * num_rows < num_sms:
        block_s, d_blocks = COMBINE_WIDE
    if block_d % (16 * d_blocks):
        d_blocks = 1
    block_dc = block_d // d_blocks
    block_r = max(1, min(COMBINE_MAX_ROWS, COMBINE_TILE // (block_s * block_dc), next_power_of_2(num_rows)))
    if num_sms:
        # round down to a power of two: about one program per SM at least
        block_r = min(block_r, 1 << max(batch * num_rows // num_sms, 1).bit_length() - 1)
    block_so = max(block_s, COMBINE_TILE // (block_r * block_dc)) if not num_splits else 1
    _combine_kernel[(cdiv(num_rows, block_r), batch, d_blocks)](
        o_part, lse_part, out4, lse if lse is not None else lse_part, chunk_counts,
        sinks if sinks is not None else lse_part, batch, slots_per_seq, overflow_slots, num_rows, num_q_heads,
        out4.stride(0), out4.stride(1), out4.stride(2),
        NUM_SPLITS=num_splits, HEAD_DIM=head_dim, BLOCK_S=block_s, BLOCK_SO=block_so, BLOCK_R=block_r,
        BLOCK_D=block_d, BLOCK_DC=block_dc, WRITE_LSE=lse is not None, HAS_SINKS=sinks is not None,
        USE_PDL=pdl, **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip


def decode_splitk(
    q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, out, lse=None, num_splits=None, num_sms=None,
    config=None, return_partials=False, features=None, split_tokens=None,
):  # fmt: skip
    """Launch the partial and combine kernels.

    Args: as ``triton_single.decode_single`` (config overrides ``launch_config``; features as there), plus
        num_splits: None for the planned mode, or S >= 1 for S splits per sequence (fixed mode).
        num_sms: SMs to plan for (planned mode); defaults to the device's.
        split_tokens: deterministic mode: splits of this many tokens (a multiple of BLOCK_N); num_splits must be None.
        return_partials: also return the fp32 partial outputs [programs, q_len * Hq, BLOCK_D] and LSEs
            [programs, q_len * Hq], row = token * Hq + head (tests; rows as ``slot_plan`` lists them in the planned
            mode, where single-chunk sequences go straight to ``out`` and leave their rows unset, as do unused ones).
            Partials hold no sink (it joins in the combine).
    """
    q4, out4 = as_rows(q), as_rows(out)
    batch, q_len, num_q_heads, head_dim = q4.shape
    num_kv_heads, page_size = k_cache.shape[2], k_cache.shape[1]
    group = num_q_heads // num_kv_heads
    features = features or Features()
    assert features.q_len == q_len, f"features.q_len {features.q_len} != q's q_len {q_len}"
    assert num_splits is None or num_splits >= 1, f"num_splits must be None or >= 1, got {num_splits}"
    assert num_splits is not None or batch <= MAX_PLANNED_BATCH, f"planned mode takes B <= {MAX_PLANNED_BATCH}"
    assert lse is None or lse.is_contiguous(), "lse workspace must be contiguous [B, (q_len,) Hq]"
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 16
    cfg, saturation = split_config(head_dim, group, q.dtype, q_len, k_cache.element_size(), num_kv_heads)
    cfg.update(config or {})
    head_blocks = cdiv(q_len * group, cfg["BLOCK_H"])
    max_tokens = block_table.shape[1] * page_size
    if split_tokens:
        assert num_splits is None and split_tokens % cfg["BLOCK_N"] == 0, f"split_tokens {split_tokens} vs {cfg}"
        num_splits = max(1, cdiv(max_tokens, split_tokens))
    if num_splits is None:
        fixed = 0
        slots_per_seq, overflow_slots = plan_grid(batch, num_kv_heads, saturation * num_sms)
        chunks = overflow_slots + batch * slots_per_seq
        chunk_counts = torch.empty(2, batch, dtype=torch.int32, device=q.device)
    else:
        fixed, slots_per_seq, overflow_slots, chunks = num_splits, num_splits, 0, batch * num_splits
        # fixed mode never reads it
        chunk_counts = cache_seqlens
    o_part = torch.empty(chunks, q_len * num_q_heads, cfg["BLOCK_D"], dtype=torch.float32, device=q.device)
    lse_part = torch.empty(chunks, q_len * num_q_heads, dtype=torch.float32, device=q.device)
    fargs = features.kernel_args(cache_seqlens)
    pdl = use_pdl(q.device)
    # natural-scale logits when softcap or ALiBi act on them; the kernel goes to log2 units afterwards
    natural = features.softcap is not None or features.alibi_slopes is not None
    # planned grids have X + B * S <= 1.25 * max(target / Hkv, B) + 1 programs per head, within grid dim 1's 65535;
    # fixed ones may not
    heads_first = PARTIAL_HEADS_FIRST and not fixed
    grid = (num_kv_heads * head_blocks, chunks) if heads_first else (chunks, num_kv_heads * head_blocks)
    _partial_kernel[grid](
        q4, k_cache, v_cache, cache_seqlens, block_table, chunk_counts, o_part, lse_part, out4,
        lse if lse is not None else lse_part,
        qk_scale=softmax_scale * (1.0 if natural else LOG2E), num_q_heads=num_q_heads, batch=batch,
        slots_per_seq=slots_per_seq, overflow_slots=overflow_slots,
        stride_qb=q4.stride(0), stride_qt=q4.stride(1), stride_qh=q4.stride(2),
        stride_kp=k_cache.stride(0), stride_kt=k_cache.stride(1), stride_kh=k_cache.stride(2),
        stride_vp=v_cache.stride(0), stride_vt=v_cache.stride(1), stride_vh=v_cache.stride(2),
        stride_sl=cache_seqlens.stride(0), stride_btb=block_table.stride(0), stride_btp=block_table.stride(1),
        stride_ob=out4.stride(0), stride_ot=out4.stride(1), stride_oh=out4.stride(2),
        NUM_SPLITS=fixed, SPLIT_TOKENS=split_tokens or 0, GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        DOT_F32=dot_in_fp32(q.dtype), WRITE_LSE=lse is not None, HEAD_BLOCKS=head_blocks, HEADS_FIRST=heads_first,
        USE_PDL=pdl, BLOCK_B=next_power_of_2(batch) if not fixed else 1, **fargs, **cfg,
    )  # fmt: skip
    # every sequence is one chunk (written by its partial program) when fixed to one split, or when the table
    # cannot hold more than one tile
    if fixed > 1 or (not fixed and max_tokens > cfg["BLOCK_N"]):
        launch_combine(
            o_part, lse_part, out4, lse, chunk_counts, slots_per_seq, fixed, sinks=features.sinks,
            deterministic=bool(split_tokens), pdl=pdl, num_sms=num_sms, overflow_slots=overflow_slots,
        )  # fmt: skip
    if return_partials:
        return out, lse, o_part, lse_part
    return out, lse


def splitk_partials_mirror(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, chunks):
    """PyTorch float64 mirror of the partial kernel: each chunk's (o_c, lse_c) for the given
    [(sequence, start, end), ...] (from ``slot_plan``, whose unused slots are None, or ``split_bounds``).

    Returns o_part [chunks, Hq, D] and lse_part [chunks, Hq] float64 on the CPU; empty chunks and unused slots are
    (0, -inf).
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
    for c, chunk in enumerate(chunks):
        if chunk is None or chunk[1] == chunk[2]:
            continue
        b, start, end = chunk
        tokens = torch.arange(start, end)
        pages = table[b, tokens // page_size] * page_size + tokens % page_size
        o, lse = reference_dense(q[b : b + 1], flat_k, flat_v, torch.tensor([end - start]), pages[None], softmax_scale)
        o_part[c], lse_part[c] = o[0], lse[0]
    return o_part, lse_part
