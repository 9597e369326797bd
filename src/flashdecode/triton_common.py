"""Triton helpers shared by the decode kernels, written once.

* ``load_q_rows``: the [BLOCK_H, BLOCK_D] tile of query rows that share one KV head (GQA packing; with multi-token
  queries row r is token r // GROUP, head r % GROUP), padding rows and columns masked to 0 so that ``tl.dot`` can
  run at its minimum tile height of 16.
* ``attend_range``: the online-softmax walk over tokens [start, end) of one sequence's paged K/V, in base-2
  (scores are pre-multiplied by scale * log2(e), so exp(x) becomes exp2) with fp32 state.
* ``softmax_step``: one online-softmax update from a tile of scores (shared by every kernel's walk).
* ``finalize``: out = acc / l and the natural-log LSE, with 0 / -inf for an empty range, never NaN.
* ``add_sink``: a per-head sink logit joins a final result's softmax denominator.

Model features (softcap, ALiBi, sinks, sliding window, multi-token queries, fp8 KV) are constexpr switches of these
helpers, bundled on the host by ``Features``; with every switch off the kernels compile to the plain decode path.

State names follow the papers: ``m_i`` running max (log2 units in the attention walk; in the LSE merges of
triton_splitk a natural-log LSE), ``l_i`` running sum, ``acc`` the unnormalised output. See docs/design.md for the
derivation and docs/features.md for the features.

The call chain of a kernel: ``attend_group`` (one program's query rows against one KV head: ``group_rows``,
``load_q_rows``, the window's start, then ``attend_range`` -> ``softmax_step`` per tile, then ``finalize``) and
``store_group`` (the rows' out and LSE, or a split's partials). The rest of this module serves the launchers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton
import triton.language as tl

from .env import env_flag

# exp(x) = exp2(x * LOG2E): the scale is folded into one multiply of the scores
LOG2E = 1.4426950408889634
# the same, readable inside kernels
LOG2E_C = tl.constexpr(1.4426950408889634)
# log(x) = log2(x) * LN2 (a constexpr so kernels can read it)
LN2 = tl.constexpr(0.6931471805599453)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host code: ``triton.cdiv`` is a constexpr function whose wrapper costs ~4 us a call on the
    host, and a decode call makes a dozen such calls (docs/design.md, eager host time)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for 0, as ``triton.next_power_of_2``), for host code, like ``cdiv``."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1, read as Triton reads it)."""
    return bool(triton.knobs.runtime.interpret)


def dot_in_fp32(dtype) -> bool:
    """Whether tiles must be upcast before ``tl.dot``.

    fp32 inputs use an IEEE fp32 dot (not TF32) so an fp32 cache keeps fp32 accuracy. Under the interpreter,
    bf16 ``tl.dot`` returns garbage (numpy has no bf16), so low-precision tiles are upcast there too.
    """
    import torch

    return dtype == torch.float32 or interpreting()


def use_pdl(device) -> bool:
    """Whether to chain the split-K launches with programmatic dependent launch (Hopper and newer, not under the
    interpreter): a kernel launched with it is scheduled while its predecessor still runs and waits in
    ``wait_for_previous`` before touching memory, so the launch gap between planner, partial and combine shrinks.
    ``PDL`` (module attribute) switches it off for measurements."""
    if not PDL or device.type != "cuda" or interpreting():
        return False
    return _capability_major(device.index) >= 9


# with PDL, also launch each call's first kernel with it, waiting before its first load, and let each call's last
# kernel start the next kernel once its programs are past their main loop: in a stream of calls (a model's layers, a
# CUDA graph of steps) the next call's programs are resident when this one ends (FlashInfer's decode does the same;
# docs/design.md, "Chaining calls"); False: a call's first kernel is launched normally (measurements)
CHAIN_PDL = True


def chain_pdl(device) -> bool:
    """Whether a call's first kernel is launched with PDL too (``CHAIN_PDL``, where ``use_pdl``)."""
    return CHAIN_PDL and use_pdl(device)


@functools.lru_cache(maxsize=None)
def _capability_major(index) -> int:
    import torch

    return torch.cuda.get_device_capability(index)[0]


PDL = True


@triton.jit
def wait_for_previous(USE_PDL: tl.constexpr):
    """With PDL: block until the previous kernel in the stream has finished and its writes are visible. Called
    before the first global load of a kernel launched with launch_pdl=True."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def let_next_start(USE_PDL: tl.constexpr):
    """With PDL: allow the next kernel (launched with launch_pdl=True) to be scheduled now; it still waits for
    this one's completion in ``wait_for_previous`` before reading anything."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


# a batch is "even" (``even_batch``) when its longest visible length is at most 1 + 1 / EVEN_SLACK times the mean:
# 3/2. H200, uneven batches of 2-4 single-pass programs per SM (perf_probe threshold at 90052d2 and waves at ec6bdac,
# graph µs, planned / single pass): max / mean 1.12: 261.2 / 247.7, 1.23: 26.3 / 22.5, 1.25: 273.8 / 249.3, 1.38:
# 27.8 / 23.7, 1.45: 43.5 / 37.5; 1.6: 180.8 / 200.8 (docs/design.md)
EVEN_SLACK = tl.constexpr(2)


@triton.jit
def even_test(longest, total, span):
    """The dual path's evenness test on a batch's longest and total visible lengths: longest * span * SLACK <= total *
    (SLACK + 1), span the batch size B (the longest at most 1 + 1 / SLACK times the mean), or in a full grid the
    sequences a wave holds (``even_batch``'s SPAN)."""
    return longest.to(tl.int64) * span * EVEN_SLACK <= total * (EVEN_SLACK + 1)


@triton.jit
def even_batch(
    SEQLENS, stride_sl, batch, window, BLOCK_B: tl.constexpr, HAS_WINDOW: tl.constexpr, Q_LEN: tl.constexpr,
    LONG_MEAN: tl.constexpr = 0, SPAN: tl.constexpr = 0,
):  # fmt: skip
    """(even, short) for the visible lengths L_b of the B <= BLOCK_B sequences. even: the single pass suits them,
    max_b L_b * B * EVEN_SLACK <= sum_b L_b * (EVEN_SLACK + 1) (``even_test``), with SPAN > 0 (a full grid, SPAN < B
    sequences a wave) in place of B: no program of the longest sequence outlasts a wave's share of the work by more
    than 1 / EVEN_SLACK (``triton_splitk.full_grid_span``). short: with LONG_MEAN > 0, sum_b L_b < LONG_MEAN * B
    (a single pass whose last wave would be a few long programs: ``triton_splitk.single_pass_tail``), else always.
    A dual-path call's kernels (single pass, planner, partial, combine) each compute it from the lengths, an input no
    kernel of the call writes, so they agree without waiting for one another (``triton_splitk.decode_splitk``,
    docs/design.md)."""
    offs_b = tl.arange(0, BLOCK_B)
    lens = tl.load(SEQLENS + offs_b * stride_sl, mask=offs_b < batch, other=0)
    lens = lens - window_starts(lens, window, HAS_WINDOW, Q_LEN)
    longest = tl.max(lens, axis=0).to(tl.int64)
    total = tl.sum(lens.to(tl.int64), axis=0)
    even = even_test(longest, total, SPAN if SPAN else batch)
    short = total >= 0
    if LONG_MEAN:
        short = total < LONG_MEAN * batch
    return even, short


@triton.jit
def planned_from(SEQLENS, stride_sl, batch, window, tail_first, BLOCK_B: tl.constexpr, HAS_WINDOW: tl.constexpr,
                 Q_LEN: tl.constexpr, LONG_MEAN: tl.constexpr, SPAN: tl.constexpr = 0):  # fmt: skip
    """The planned kernels of a dual-path call: the first sequence they write, or -1 when the single pass writes
    every one (an even batch, short if LONG_MEAN > 0; even over SPAN sequences if SPAN > 0). An even batch of long
    sequences under the tail gate is the single pass's up to sequence tail_first and theirs from there
    (``triton_splitk.single_pass_tail``); an uneven one is theirs from 0."""
    even, short = even_batch(SEQLENS, stride_sl, batch, window, BLOCK_B, HAS_WINDOW, Q_LEN, LONG_MEAN, SPAN)
    return tl.where(even, tl.where(short, -1, tail_first), 0)


# longest_first's buckets (and the planner's dispatch order): lengths within longest / ORDER_BUCKETS of each other
# keep their batch order
ORDER_BUCKETS = tl.constexpr(32)


@triton.jit
def _max_and_sum(a_max, a_sum, b_max, b_sum):
    return tl.maximum(a_max, b_max), a_sum + b_sum


@triton.jit
def bucket_ranks(lengths, valid, ranks):
    """The longest-first order of a counting sort, looked up: for each rank r in ``ranks`` [R] (0 the longest), the
    index of the valid entry of ``lengths`` [BLOCK_B] with that rank (an r past the valid entries gives an index >= the
    last valid one's). Lengths go into ORDER_BUCKETS buckets of longest / ORDER_BUCKETS, the longest bucket first,
    index order within a bucket: one histogram, no sort. Shared by the single pass's slots (``longest_first``) and
    the planner's last chunks (``triton_splitk.dispatch_chunks``); ``longest_first_order`` is the host mirror."""
    longest = tl.max(tl.where(valid, lengths, 0), axis=0)
    # bucket 0 holds the longest; [buckets] sizes, and the ranks before each bucket (exclusive prefix)
    bucket = ((longest - lengths) * ORDER_BUCKETS) // (longest + 1)
    sizes = tl.histogram(bucket, ORDER_BUCKETS, mask=valid)
    before = tl.cumsum(sizes, axis=0) - sizes
    # [R, buckets]: a rank's bucket is the last one starting at or before it (empty buckets share the next start);
    # then its rank among that bucket's entries, found in a [R, BLOCK_B] running count
    at = before[None, :] <= ranks[:, None]
    mine = tl.sum(at.to(tl.int32), axis=1) - 1
    within = ranks - tl.max(tl.where(at, before[None, :], 0), axis=1)
    member = (bucket[None, :] == mine[:, None]) & valid[None, :]
    return tl.sum((tl.cumsum(member.to(tl.int32), axis=1) <= within[:, None]).to(tl.int32), axis=1)


@triton.jit
def longest_first(SEQLENS, stride_sl, batch, slot, window, BLOCK_B: tl.constexpr, HAS_WINDOW: tl.constexpr,
                  Q_LEN: tl.constexpr, SPAN: tl.constexpr = 0):  # fmt: skip
    """(sequence, its length, ours) for grid slot `slot` of the B <= BLOCK_B sequences when the slots go longest
    first. A grid larger than the SMs can hold runs in waves, and a long sequence dispatched in the last one ends
    far after the rest (a greedy schedule's worst case); longest first is the classic fix. An even batch
    (``even_test`` over B) keeps its order: its slot's own length is loaded alongside the lengths tile, so it pays
    one reduction over the tile. Otherwise ``bucket_ranks`` of the visible lengths. ours: with SPAN > 0 (the single
    pass of a full grid's dual-path call), ``even_batch``'s test over SPAN sequences, and no sort when it fails (the
    planned kernels take the batch); else True. ``longest_first_order`` is the host mirror."""
    own = tl.load(SEQLENS + slot * stride_sl)
    offs_b = tl.arange(0, BLOCK_B)
    valid = offs_b < batch
    lens = tl.load(SEQLENS + offs_b * stride_sl, mask=valid, other=0)
    visible = lens - window_starts(lens, window, HAS_WINDOW, Q_LEN)
    longest, total = tl.reduce((visible, visible.to(tl.int64)), 0, _max_and_sum)
    seq, seqlen = slot, own
    ours = total >= 0
    if SPAN:
        ours = even_test(longest, total, SPAN)
    if ours & ~even_test(longest, total, batch):
        seq = tl.sum(bucket_ranks(visible, valid, tl.full([1], slot, tl.int32)), axis=0)
        seqlen = tl.sum(tl.where(offs_b == seq, lens, 0), axis=0)
    return seq, seqlen, ours


def visible_lengths(seqlens, window_left=None, q_len=1) -> list[int]:
    """Each sequence's visible tokens on the host (``window_starts``'s rule): all of them without a window."""
    return [n - (0 if window_left is None else max(n - q_len - window_left, 0)) for n in seqlens]


def longest_first_order(seqlens, window_left=None, q_len=1) -> list[int]:
    """``longest_first``'s order on the host (tests): the sequence of each grid slot."""
    visible = visible_lengths(seqlens, window_left, q_len)
    if not visible or even_lengths(visible):
        return list(range(len(seqlens)))
    return bucket_order(visible)


def bucket_order(lengths) -> list[int]:
    """``bucket_ranks``'s order on the host: the indices of ``lengths``, longest bucket first, index order within."""
    longest = max(lengths, default=0)
    buckets = [(longest - n) * ORDER_BUCKETS.value // (longest + 1) for n in lengths]
    return sorted(range(len(lengths)), key=lambda b: (buckets[b], b))


def even_lengths(seqlens, window_left=None, q_len=1, long_mean=0, span=0) -> bool:
    """``even_batch``'s even and short together, on the host (tests): the same integer tests over the visible
    lengths (span: its SPAN, 0 for the batch size)."""
    visible = visible_lengths(seqlens, window_left, q_len)
    even = max(visible) * (span or len(visible)) * EVEN_SLACK.value <= sum(visible) * (EVEN_SLACK.value + 1)
    return even and (not long_mean or sum(visible) < long_mean * len(visible))


# below this many query heads per KV head, products run on the CUDA cores instead of tl.dot. Measured on the H200
# (scripts/sweep.py): tl.dot won even for MHA (group 1 padded to 16 rows), so every group uses it
DOT_MIN_GROUP = 1
# query rows per program at most: the q tile and the fp32 accumulator [BLOCK_H, BLOCK_D] live in registers, so
# BLOCK_H <= 64 and BLOCK_H * BLOCK_D is capped (32 rows at head_dim 256); more rows get more head blocks in the grid
MAX_TILE_ROWS = 64
MAX_TILE_ROWS_X_D = 64 * 128
# [BLOCK_H, BLOCK_D] tiles larger than this get 8 warps: with 4, ptxas spills ~800 bytes per thread at 64 x 128
# (scripts/ttgir_ops.py-style sm90 compile without a GPU; 8 warps: 24 bytes). Not yet timed: scripts/gpu_feat.sh
# times both on such rows. Every measured bf16 configuration (BLOCK_H x BLOCK_D <= 32 x 128) keeps 4 warps
WIDE_TILE = 32 * 128
# GQA groups of 4-16 (one 16-row tl.dot tile), head_dim <= 128, 16-bit cache: 32-token tiles, 3 stages and the page
# ids one tile ahead (attend_range's PREFETCH_PAGES): two K/V buffers, 38 KB and 86 registers a program, 5 programs
# per SM. None: off (docs/design.md, "What each optimisation bought")
PREFETCH_TILE = dict(BLOCK_N=32, num_stages=3, PREFETCH_PAGES=True)
# ...and an fp8 cache's single pass and long split-K chunks (the fused merge's) 128-token tiles at 3 stages with the
# prefetch (96 KB): a 1-byte token row makes short tiles all overhead. pipeline_probe fp8 at d6cf225, single pass
# 64 x 4096 32/8: e4m3 196.5 us (e5m2 196.8) against 230.0 with PREFETCH_TILE, 330.2 with the plain 64-token tile,
# and bf16's 242.1
FP8_LONG_TILE = dict(BLOCK_N=128, num_stages=3, PREFETCH_PAGES=True)
# ...at FP8_LONG_PROGRAMS_PER_SM programs per SM, its measured occupancy with a head-dim-major V (199 registers).
# A token-major V (v_token_major) takes 164 registers, and 3 would fit: a 512-program single pass is then 1.29 waves
# of 3 instead of 1.94 of 2, and a one-wave split-K grid piles onto fewer SMs (launcher.cap_programs_per_sm). None:
# uncapped
FP8_LONG_PROGRAMS_PER_SM = 2
# ...but a single pass of more than 2 and at most FP8_LONG_ONE_WAVE programs per SM runs as one wave of that many
# where the registers let them fit (token-major V; head-dim-major V still fits 2); not above one wave, where it lost
# (docs/design.md, "Programs per SM")
FP8_LONG_ONE_WAVE = 3
# ...and an fp8 cache's split-K calls whose chunks may be short (all but the fused merge's): 64-token tiles with the
# prefetch, capped at 128 registers (ptxas .maxnreg) so more programs fit an SM. pipeline_probe fp8reg at 7d8c95d:
# 1 x 131072 32/8 e4m3 124.6 us with PREFETCH_TILE -> 111.2 (FP8_LONG_TILE 112.6), 1 x 65536 12/2 22.0 -> 21.9
# (FP8_LONG_TILE 26.0). The cap does not pay at 128 tokens (198 registers: 168 -> 314.7 us on the single pass)
FP8_SPLIT_TILE = dict(BLOCK_N=64, num_stages=3, PREFETCH_PAGES=True, maxnreg=128)
# ...and a single pass whose programs each have an SM to themselves (programs <= #SMs) takes 128-token tiles at 3
# stages (192 KB in a 16-bit cache): bytes in flight matter there, not occupancy. An 8-bit cache and head dim 256
# keep PREFETCH_ONE_WAVE_TILE_64 (docs/design.md, "Bytes in flight")
PREFETCH_ONE_WAVE_TILE = dict(BLOCK_N=128, num_stages=3, PREFETCH_PAGES=True)
PREFETCH_ONE_WAVE_TILE_64 = dict(BLOCK_N=64, num_stages=3, PREFETCH_PAGES=True)
# with attend_range's 32-bit address arithmetic PREFETCH_TILE takes 86 registers, so this many programs fit an SM (4
# before); a 4th stage (PREFETCH_DEEP_TILE, 54 KB) holds 4 again, which the single pass takes beyond one wave of 5
# (docs/design.md, "Address arithmetic in the main loop")
PREFETCH_TILE_PER_SM = 5
PREFETCH_DEEP_TILE = dict(BLOCK_N=32, num_stages=4, PREFETCH_PAGES=True)
# with the page-id prefetch, the first tile's page ids issue before the lengths arrive (attend_range's EARLY_PAGES):
# the single pass from token 0, fixed splits from where a plan's length puts them (decode_splitk's len_hint).
# Measured in docs/design.md, "The first page ids before the lengths". FLASHDECODE_EARLY_PAGES=0 (or False here,
# then launcher.clear()): after the lengths, as before
EARLY_PAGES = env_flag("FLASHDECODE_EARLY_PAGES", True)
# GQA groups of 4-16, one query token, 16-bit cache, head dims other than 128: a deeper tile without the page-id
# prefetch. {BLOCK_D: overrides}; an empty dict: off (docs/design.md, "What each optimisation bought")
HEAD_DIM_TILES = {64: dict(BLOCK_N=128, num_stages=2), 256: dict(BLOCK_N=64, num_stages=2, num_warps=8)}
# ...and the single pass at head_dim 256 a third stage with the page ids one tile ahead (192 KB, one program per SM):
# 64 x 4096 32/8 512.2 -> 503.6 (ed7a875) and 512.3 -> 502.5 (dba0677); the split-K rows lose with it (1 x 8192 32/8
# 28.6 -> 35.6, 26.5 -> 31.3)
SINGLE_PASS_HEAD_DIM_TILES = {256: dict(BLOCK_N=64, num_stages=3, num_warps=8, PREFETCH_PAGES=True)}
# an fp8 cache's products in fp16 (KV_FP8 = 2: q converted once, saturating at +-65504; K, V tiles fp8 -> fp16, one
# instruction per two elements on sm_89+) rather than in q's dtype (KV_FP8 = 1: fp8 -> bf16 goes through fp32)
FP8_DOT_F16 = True
# shared memory for the K and V pipeline buffers (BLOCK_N x BLOCK_D x stages x 2 x itemsize), of the 227 KB a block
# may use on H100/H200, leaving room for the compiler's layout-conversion scratch
SMEM_BUDGET = 160 * 1024


def single_pass_long_grid(cfg: dict, programs: int, num_sms: int | None) -> bool:
    """Whether a single pass of ``programs`` with tile ``cfg`` takes ``PREFETCH_DEEP_TILE``: PREFETCH_TILE's grid is
    more than one wave of PREFETCH_TILE_PER_SM programs per SM (then the waves are of 4, as the tail gate counts)."""
    return uses_prefetch_tile(cfg) and bool(PREFETCH_DEEP_TILE) and bool(num_sms) and (
        programs > PREFETCH_TILE_PER_SM * num_sms
    )


def uses_tile(cfg: dict, tile: dict | None) -> bool:
    """Whether a launch config is a tile table entry's (every key of it set to its value); None: off, never."""
    return bool(tile) and all(cfg.get(k) == v for k, v in tile.items())


def tile_programs_per_sm(cfg: dict, single_programs: int = 0, num_sms: int | None = None) -> int | None:
    """The programs per SM a launch config's tile is capped at (``launcher.cap_programs_per_sm``), or None.
    single_programs: the grid of a single pass (0: not one), which fits one wave of ``FP8_LONG_ONE_WAVE``."""
    if not uses_tile(cfg, FP8_LONG_TILE) or not FP8_LONG_PROGRAMS_PER_SM:
        return None
    one_wave = FP8_LONG_ONE_WAVE and num_sms
    if one_wave and FP8_LONG_PROGRAMS_PER_SM * num_sms < single_programs <= FP8_LONG_ONE_WAVE * num_sms:
        return FP8_LONG_ONE_WAVE
    return FP8_LONG_PROGRAMS_PER_SM


def pages_before_lengths(cfg: dict, features) -> bool:
    """Whether a launch loads its first page ids before the lengths (``EARLY_PAGES``): the page-id prefetch and no
    window (a window's first token comes from the length)."""
    return bool(EARLY_PAGES and cfg["PREFETCH_PAGES"] and features.window_left is None)


def uses_prefetch_tile(cfg: dict) -> bool:
    """Whether a launch config is PREFETCH_TILE's."""
    return uses_tile(cfg, PREFETCH_TILE)


def cache_offsets_fit_int32(*caches) -> bool:
    """Whether every offset attend_range computes in 32 bits (OFFS_I32) fits: page * stride + row * stride + column
    * stride < 2**31 elements in each [num_pages, page_size, Hkv, D] cache view (the KV head's offset is added in
    64 bits)."""
    for c in caches:
        num_pages, page_size, _, head_dim = c.shape
        last = (num_pages - 1) * c.stride(0) + (page_size - 1) * c.stride(1)
        if last + next_power_of_2(head_dim) * max(c.stride(3), 1) >= 2**31:
            return False
    return True


def launch_config(
    head_dim: int, group: int, dtype, q_len: int = 1, kv_itemsize: int | None = None, prefetch: bool = True,
    single: bool = False,
) -> dict:  # fmt: skip
    """A fresh copy of ``_launch_config`` (cached: launchers update their copy)."""
    return dict(_launch_config(head_dim, group, dtype, q_len, kv_itemsize, prefetch, single))


@functools.lru_cache(maxsize=256)
def _launch_config(
    head_dim: int, group: int, dtype, q_len: int = 1, kv_itemsize: int | None = None, prefetch: bool = True,
    single: bool = False,
) -> dict:  # fmt: skip
    """Tile sizes, warps and stages for one (head_dim, rows, dtype): one small table, no per-call autotuning.

    Measured on the H200 (scripts/sweep.py, docs/design.md). BLOCK_N tokens per tile; K and V tiles of
    [BLOCK_N, BLOCK_D] per pipeline stage in shared memory:
    * group < 4 (MHA-like): BLOCK_N 128, 2 stages (64 KB a stage in bf16): deep tiles, few rows of work per byte;
    * group >= 4: BLOCK_N 64, 3 stages (32 KB a stage, 2 programs per SM);
    * head_dim 256: BLOCK_N halved to keep the same shared memory;
    * then BLOCK_N halves while BLOCK_N x BLOCK_D x stages x 2 x itemsize > SMEM_BUDGET (fp32 caches).
    BLOCK_H: the q_len x group query rows, padded to 16 (the smallest tl.dot height), at most
    min(MAX_TILE_ROWS, MAX_TILE_ROWS_X_D / BLOCK_D); rows beyond it go to further head blocks (a grid dimension),
    each of which reads the KV head's tokens again. BLOCK_D: head_dim padded to a power of two (masked).
    num_warps: 4, or 8 for tiles of more than WIDE_TILE elements.
    kv_itemsize: bytes per cache element (1 for fp8), defaults to dtype's.
    prefetch: allow ``PREFETCH_TILE`` (one query token, groups of 4-16, head_dim 128 in a 16-bit cache: the
    measured cases); the same calls at head_dim 64 and 256 take ``HEAD_DIM_TILES``, and
    ``SINGLE_PASS_HEAD_DIM_TILES`` over them for the single pass (single). An fp8 cache at head_dim 128 (groups of
    4-16, one token): ``FP8_LONG_TILE`` for the single pass and long chunks (prefetch False: the split-K launcher's
    fused merge), ``FP8_SPLIT_TILE`` for split-K's others.
    """
    import torch

    rows = q_len * group
    block_d = max(16, next_power_of_2(head_dim))
    use_dot = group >= DOT_MIN_GROUP
    block_n, stages = (128, 2) if group < 4 else (64, 3)
    if block_d > 128:
        block_n //= 2
    itemsize = kv_itemsize if kv_itemsize is not None else torch.empty((), dtype=dtype).element_size()
    while block_n > 16 and block_n * block_d * stages * 2 * itemsize > SMEM_BUDGET:
        block_n //= 2
    block_h = max(16, next_power_of_2(rows)) if use_dot else next_power_of_2(rows)
    block_h = min(block_h, MAX_TILE_ROWS, max(16, MAX_TILE_ROWS_X_D // block_d))
    cfg = dict(
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        USE_DOT=use_dot,
        PREFETCH_PAGES=False,
        num_warps=8 if block_h * block_d > WIDE_TILE else 4,
        num_stages=stages,
    )
    if q_len == 1 and 4 <= group <= 16 and itemsize == 1 and block_d == 128:
        cfg.update(FP8_SPLIT_TILE if prefetch and not single else FP8_LONG_TILE)
    elif q_len == 1 and 4 <= group <= 16 and itemsize == 2:
        if prefetch and PREFETCH_TILE and block_d == 128:
            cfg.update(PREFETCH_TILE)
        elif block_d in HEAD_DIM_TILES:
            cfg.update(HEAD_DIM_TILES[block_d])
            if single:
                cfg.update(SINGLE_PASS_HEAD_DIM_TILES.get(block_d, {}))
    return cfg


@dataclass(frozen=True)
class Features:
    """Model features of one call, as the kernels take them (see docs/features.md for the math).

    softcap: float > 0 or None. alibi_slopes, sinks: [Hq] fp32 tensors or None. window_left: int >= 0 or None
    (key j is visible from query position p iff p - window_left <= j <= p). q_len: query tokens per sequence.
    kv_fp8: the cache is float8; k_scale, v_scale: Python floats or 0-d / 1-element fp32 device tensors.
    """

    softcap: float | None = None
    alibi_slopes: object = None
    sinks: object = None
    window_left: int | None = None
    q_len: int = 1
    kv_fp8: bool = False
    k_scale: object = 1.0
    v_scale: object = 1.0

    def kernel_args(self, dummy) -> dict:
        """Keyword arguments shared by the single-pass and partial kernels; ``dummy`` fills unused pointers."""
        return {
            **self._fixed_kernel_args,
            "ALIBI": self.alibi_slopes if self.alibi_slopes is not None else dummy,
            "SINKS": self.sinks if self.sinks is not None else dummy,
        }

    @functools.cached_property
    def launch_key_parts(self) -> tuple[tuple, tuple]:
        """(the fields that are not tensors, the tensors or None: alibi_slopes, sinks, k_scale, v_scale), for the
        cached launcher: the first joins its key, the second its inputs (launcher.py)."""
        import torch

        fields = (self.alibi_slopes, self.sinks, self.k_scale, self.v_scale)
        tensors = tuple(x if isinstance(x, torch.Tensor) else None for x in fields)
        scalars = tuple(None if isinstance(x, torch.Tensor) else x for x in fields[2:])
        return (self.softcap, self.window_left, self.q_len, self.kv_fp8) + scalars, tensors

    @functools.cached_property
    def _fixed_kernel_args(self) -> dict:
        """The part of ``kernel_args`` that is the same on every call (the instance is frozen): built once, as
        the host time of an eager call matters (docs/design.md)."""
        scale_ptr = not isinstance(self.k_scale, (int, float))
        both = scale_ptr == (not isinstance(self.v_scale, (int, float)))
        assert both, "k_scale and v_scale: both floats or both device tensors"
        return dict(
            softcap=float(self.softcap or 0.0),
            window=int(self.window_left if self.window_left is not None else 0),
            K_SCALE=self.k_scale if scale_ptr else float(self.k_scale),
            V_SCALE=self.v_scale if scale_ptr else float(self.v_scale),
            HAS_SOFTCAP=self.softcap is not None,
            HAS_ALIBI=self.alibi_slopes is not None,
            HAS_SINKS=self.sinks is not None,
            HAS_WINDOW=self.window_left is not None,
            Q_LEN=self.q_len,
            KV_FP8=(2 if FP8_DOT_F16 else 1) if self.kv_fp8 else 0,
            SCALE_PTR=scale_ptr,
        )


# the features of a call that uses none (single-token query, bf16 / fp16 / fp32 cache): one shared instance
PLAIN = Features()


@triton.jit
def load_q_rows(Q, stride_qt, stride_qh, row_tok, row_head, mask_h, offs_d, HEAD_DIM: tl.constexpr):
    """The [BLOCK_H, BLOCK_D] tile of query rows (token row_tok, head row_head) of one sequence: Q already points at
    the sequence, padding rows (mask_h False) and columns past HEAD_DIM load as 0."""
    mask = mask_h[:, None] & (offs_d[None, :] < HEAD_DIM)
    ptrs = Q + row_tok[:, None].to(tl.int64) * stride_qt + row_head[:, None].to(tl.int64) * stride_qh + offs_d[None, :]
    return tl.load(ptrs, mask=mask, other=0.0)


# attend_range keeps the softmax's row sums as a [BLOCK_H, BLOCK_N] tile of per-token running sums, reduced once
# after its walk, in the 16-bit page-prefetch tiles of 32 and 128 tokens only (defer_row_sum; elsewhere the registers
# cost programs per SM). FLASHDECODE_DEFER_SUM=0: a row sum per tile (docs/design.md, "The row sum, once")
DEFER_ROW_SUM = tl.constexpr(env_flag("FLASHDECODE_DEFER_SUM", True))


@triton.constexpr_function
def defer_row_sum(switch, block_n, prefetch_pages, kv_fp8):
    """Whether attend_range defers its row sums (switch: DEFER_ROW_SUM, passed from the kernel so that Triton keys
    its compile cache on it): in the 16-bit page-prefetch tiles of 32 and 128 tokens."""
    return bool(switch) and bool(prefetch_pages) and not kv_fp8 and block_n in (32, 128)


@triton.jit
def softmax_step(m_i, l_i, s, ROWS_MAY_BE_EMPTY: tl.constexpr = False, ROW_SUM: tl.constexpr = True):
    """One online-softmax step over a tile of scores s [BLOCK_H, N] (log2 units, -inf for masked tokens):
    (m_new, alpha, p, l_new) with alpha = exp2(m_i - m_new) the rescale of the old state and p = exp2(s - m_new)
    [BLOCK_H, N]. The caller updates acc = acc * alpha + p . V. Without ROWS_MAY_BE_EMPTY every row has a finite
    score from the first tile on; with it (causal multi-token rows) a row may still be all -inf, and is measured
    from 0 so that exp2(-inf - 0) = 0 rather than exp2(-inf + inf) = NaN."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    if ROWS_MAY_BE_EMPTY:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    if ROW_SUM:
        return m_new, alpha, p, l_i * alpha + tl.sum(p, axis=1)
    # the caller adds p's row sums itself (attend_range's DEFER_ROW_SUM)
    return m_new, alpha, p, l_i * alpha


@triton.jit
def softcap_logits(s, softcap):
    """softcap * tanh(s / softcap) for natural-scale logits s, without overflow for any finite s:
    tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2|x|) in (0, 1]. Below |x| = 1/4, where 1 - e cancels
    (it gave tanh(x) = 0 for |x| < 3e-8, a logit error of up to softcap * eps: the fuzzer's fp32 find), the odd
    Taylor series to x^9 instead (truncation < 0.1 ulp). Both within 2 fp32 ulps of tanh (5 with an exp2 2 ulps
    off), as torch.tanh is within 1."""
    x = s / softcap
    e = tl.exp2(-2.0 * LOG2E_C * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    x2 = x * x
    series = x + x * x2 * (((x2 * (62.0 / 2835.0) - 17.0 / 315.0) * x2 + 2.0 / 15.0) * x2 - 1.0 / 3.0)
    return softcap * tl.where(tl.abs(x) < 0.25, series, tl.where(x < 0, -t, t))


@triton.constexpr_function
def RUN_C(page_size, block_n):
    """Tokens of a token-major V page read as one vector (attend_range's V_T): the largest power of two that
    divides PAGE_SIZE, at most BLOCK_N, so that a run never crosses a page and a tile holds whole runs (pages of 16,
    32, 64: min(PAGE_SIZE, BLOCK_N); of 12: 4; of 48 with 64-token tiles: 16; of 17: 1, token by token)."""
    return min(page_size & -page_size, block_n)


@triton.constexpr_function
def TAIL_N(page_size, block_n):
    """The tile of a token-major V's last partial run (attend_range's V_T 2): one run, at least tl.dot's 16."""
    return min(block_n, max(RUN_C(page_size, block_n), 16))


@triton.jit
def attend_range(
    q,
    m_i,
    l_i,
    acc,
    K,
    V,
    BLOCK_ROW,
    stride_btp,
    start,
    end,
    qk_scale,
    stride_kp,
    stride_kt,
    stride_vp,
    stride_vt,
    offs_d,
    qpos,
    slope,
    softcap,
    window,
    PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_F32: tl.constexpr,
    USE_DOT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    Q_LEN: tl.constexpr,
    KV_FP8: tl.constexpr,
    PREFETCH_PAGES: tl.constexpr = False,
    OFFS_I32: tl.constexpr = False,
    V_T: tl.constexpr = 0,
    early_first=0,
    early_pages=0,
    EARLY_PAGES: tl.constexpr = False,
):
    """Online softmax over tokens [start, end) of one sequence and one KV head.

    q: [BLOCK_H, BLOCK_D] query tile. m_i, l_i: [BLOCK_H] fp32. acc: [BLOCK_H, BLOCK_D] fp32.
    K, V: cache pointers already offset to this KV head. BLOCK_ROW: this sequence's block-table row, stride_btp apart.
    USE_DOT: products on the tensor cores (tl.dot, BLOCK_H >= 16); otherwise broadcast-multiply and reduce on the
    CUDA cores. Every launch sets it (``DOT_MIN_GROUP`` = 1: tl.dot even for MHA, measured faster); the CUDA-core
    path stays for tests/test_backends.py and sweeps.
    qk_scale: scale * log2(e), or the natural scale when HAS_SOFTCAP or HAS_ALIBI (those act on natural logits).
    qpos: [BLOCK_H] int32 query position of each row (ALiBi, and the causal / window masks when Q_LEN > 1).
    slope: [BLOCK_H] fp32 ALiBi slope of each row (without HAS_ALIBI unused: any fp32). softcap: float. window:
    int (window_left). KV_FP8: 0, a 16-bit cache; 1, an fp8 cache, products in q's dtype; 2, an fp8 cache, products
    in fp16 with q clamped to +-65504 (``FP8_DOT_F16``).
    With Q_LEN == 1 every row sees [start, end): the caller starts at the window's first token, so no mask is
    needed. With Q_LEN > 1 rows differ, a tile may be fully masked for a row, and the running max is measured from 0
    while it is still -inf (so exp2(-inf - (-inf)) never happens). Otherwise every tile holds a valid token for
    every row, so m_i is finite after the first tile.
    PREFETCH_PAGES: each tile's page ids are loaded one tile ahead, into registers. The K/V loads then depend on no
    load of their own iteration and Triton's pipeliner gives them num_stages - 1 shared-memory buffers: the next
    tile's K/V are in flight while this one is computed. With the page-id load in the same iteration, page ids,
    K/V and the dot take three pipeline stages and K/V get one buffer at 3 or 4 stages (two from 5 on), so a
    program waits for each tile's K/V in turn (docs/design.md).
    OFFS_I32: every page * stride + row * stride offset of K and V fits int32 (``cache_offsets_fit_int32``): the
    address arithmetic runs in 32 bits (one IMAD a token instead of a 64-bit multiply-add).
    EARLY_PAGES (with PREFETCH_PAGES): early_pages [BLOCK_N] are the first tile's page ids, which the caller loaded
    (``first_page_ids``) from early_first, where it expected the range to start, before it read the length; if the
    range starts elsewhere they are loaded again from there (docs/design.md, "The first page ids before the
    lengths").
    V_T: 0, V's head dim is contiguous. Otherwise V's pages are token-major (``v_token_major``: stride_vt is 1,
    head-dim elements PAGE_SIZE apart), and V is loaded along its tokens, which lets an 8-bit V reach the tensor
    cores without one-byte shared loads (docs/features.md). 1: whole runs of RUN tokens (``RUN_C``: the largest
    power of two dividing PAGE_SIZE, at most BLOCK_N), one vector each; `end` is a multiple of RUN, or `start`
    itself (an empty walk: ``attend_group``), and `start` may lie inside a run (the walk starts at the run and masks
    the tokens before `start`, which exist). 2: token by token, for the last partial run of a range, whose slots
    past the sequence may hold anything (a NaN there would turn P V into NaN).
    """
    mask_d = offs_d < HEAD_DIM
    if DOT_F32 and USE_DOT:
        q = q.to(tl.float32)
    elif KV_FP8 == 2 and USE_DOT:
        # the products of an fp8 cache run in fp16 (below); q saturates at fp16's largest finite value
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    # token t is row t % PAGE_SIZE of page BLOCK_ROW[t // PAGE_SIZE]; entries past `end` are never read. Tokens are
    # >= 0, so // and % run unsigned (a signed one adds sign fixes: ~40% of the loop's instructions at head_dim 256)
    first = start
    if V_T == 1:
        # the walk starts on start's run; an empty range must not walk the tokens of that run before start
        first = start // RUN_C(PAGE_SIZE, BLOCK_N) * RUN_C(PAGE_SIZE, BLOCK_N)
        end = tl.where(end > start, end, first)
    if PREFETCH_PAGES and EARLY_PAGES:
        next_pages = early_pages
        if first != early_first:
            next_pages = first_page_ids(BLOCK_ROW, stride_btp, first, end, PAGE_SIZE, BLOCK_N)
    elif PREFETCH_PAGES:
        next_pages = first_page_ids(BLOCK_ROW, stride_btp, first, end, PAGE_SIZE, BLOCK_N)
    # [BLOCK_H, BLOCK_N] per-token running sums of p, rescaled with the state, in the tiles that defer the row sums
    DEFER: tl.constexpr = defer_row_sum(DEFER_ROW_SUM, BLOCK_N, PREFETCH_PAGES, KV_FP8)
    l_tile = tl.zeros([q.shape[0], BLOCK_N], tl.float32)
    for tile_start in range(first, end, BLOCK_N):
        if V_T == 1:
            tile_start = tl.multiple_of(tile_start, RUN_C(PAGE_SIZE, BLOCK_N))
        offs_n = tile_start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        # [BLOCK_N] the tokens whose page ids and V are read
        mask_run = mask_n
        if V_T == 1:
            # whole runs up to end (a multiple of RUN); the tokens before start are read but take no part
            mask_run = tl.max_constancy(mask_n, RUN_C(PAGE_SIZE, BLOCK_N))
            mask_n = mask_n & (offs_n >= start)
        if PREFETCH_PAGES:
            page = next_pages
            offs_next = offs_n + BLOCK_N
            next_pages = tl.load(BLOCK_ROW + (offs_next.to(tl.uint32) // PAGE_SIZE) * stride_btp,
                                 mask=offs_next < end, other=0)  # fmt: skip
        else:
            page = tl.load(BLOCK_ROW + (offs_n.to(tl.uint32) // PAGE_SIZE) * stride_btp, mask=mask_run, other=0)
        row = (offs_n.to(tl.uint32) % PAGE_SIZE).to(tl.int32)
        # [BLOCK_N] element offset of each token's row in the caches: 32-bit when the host found that every offset
        # fits (cache_offsets_fit_int32), else 64-bit
        if OFFS_I32:
            k_row = page * stride_kp + row * stride_kt
            v_row = page * stride_vp + row * stride_vt
        else:
            k_row = page.to(tl.int64) * stride_kp + row.to(tl.int64) * stride_kt
            v_row = page.to(tl.int64) * stride_vp + row.to(tl.int64) * stride_vt
        mask_kv = mask_n[:, None] & mask_d[None, :]
        # [BLOCK_N, BLOCK_D]
        k = tl.load(K + k_row[:, None] + offs_d[None, :], mask=mask_kv, other=0.0)
        if V_T == 0:
            v = tl.load(V + v_row[:, None] + offs_d[None, :], mask=mask_kv, other=0.0)
        elif V_T == 1:
            # a run's tokens are consecutive elements from a RUN-aligned offset (page strides are multiples of
            # PAGE_SIZE: v_token_major), and the tile starts on a run
            RUN: tl.constexpr = RUN_C(PAGE_SIZE, BLOCK_N)
            if KV_FP8 == 0:
                # [BLOCK_D, runs, RUN]: with the run innermost and the head dim next, a warp's lanes read 32
                # consecutive rows of one page (a [BLOCK_N, BLOCK_D] tile puts them across the tile's runs, 8 pages
                # a load). H200, 16-bit caches, plan: 64 x 4096 32/8 264.7 -> 247.0 µs, 16 x 4096 12/2 28.2 -> 24.0
                # (head-dim-major: 247.0, 23.0). An 8-bit V keeps the 2-D tile: the 3-D one reaches shared memory
                # unswizzled, and 64 x 4096 32/8 e4m3 took 233.1 µs against 187.5 (sweeps/token-major-v-cap)
                v_row3 = tl.reshape(v_row, (BLOCK_N // RUN, RUN))
                v_row3 = tl.max_contiguous(tl.multiple_of(v_row3, [1, RUN]), [1, RUN])
                mask3 = tl.max_constancy(tl.reshape(mask_run, (BLOCK_N // RUN, RUN)), [1, RUN])
                v3 = tl.load(V + v_row3[None, :, :] + (offs_d * PAGE_SIZE)[:, None, None],
                             mask=mask3[None, :, :] & mask_d[:, None, None], other=0.0)  # fmt: skip
                v = tl.trans(tl.reshape(v3, (offs_d.shape[0], BLOCK_N)))
            else:
                v_run = tl.max_contiguous(tl.multiple_of(v_row, RUN), RUN)
                v = tl.load(V + v_run[:, None] + offs_d[None, :] * PAGE_SIZE, mask=mask_run[:, None] & mask_d[None, :],
                            other=0.0)  # fmt: skip
        else:
            v = tl.load(V + v_row[:, None] + offs_d[None, :] * PAGE_SIZE, mask=mask_kv, other=0.0)
        if not USE_DOT:
            # [BLOCK_H, 1, BLOCK_D] * [1, BLOCK_N, BLOCK_D] summed over D, in fp32
            s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
        elif DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            if KV_FP8:
                # e4m3 / e5m2 values are exact in bf16 and fp16 (q's dtype: fp16 with KV_FP8 == 2)
                k = k.to(q.dtype)
                v = v.to(q.dtype)
            s = tl.dot(q, tl.trans(k))
        if HAS_SOFTCAP or HAS_ALIBI:
            # natural-scale logits: cap, then the ALiBi bias slope * (key - query position) <= 0, then to log2 units
            s = s * qk_scale
            if HAS_SOFTCAP:
                s = softcap_logits(s, softcap)
            if HAS_ALIBI:
                s = s + slope[:, None] * (offs_n[None, :] - qpos[:, None]).to(tl.float32)
            s = s * LOG2E_C
        else:
            s = s * qk_scale
        if Q_LEN > 1:
            # [BLOCK_H, BLOCK_N]: causal among the new tokens (and the window), per row
            visible = mask_n[None, :] & (offs_n[None, :] <= qpos[:, None])
            if HAS_WINDOW:
                visible = visible & (offs_n[None, :] >= qpos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
        else:
            # [BLOCK_H, BLOCK_N] scores in log2 units; padding tokens get -inf so exp2 gives exactly 0
            s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new, alpha, p, l_i = softmax_step(m_i, l_i, s, Q_LEN > 1, not DEFER)
        if DEFER:
            l_tile = l_tile * alpha[:, None] + p
        if not USE_DOT:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        elif DOT_F32:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if DEFER:
        l_i = l_i + tl.sum(l_tile, axis=1)
    return m_i, l_i, acc


@triton.jit
def first_page_ids(BLOCK_ROW, stride_btp, first, limit, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_N] page ids of tokens [first, first + BLOCK_N) of a block-table row, those at or past token `limit` 0:
    the first tile of a walk with the page-id prefetch (attend_range). With limit the row's width (its columns *
    PAGE_SIZE) a kernel can issue the load before it has its sequence's length (EARLY_PAGES); entries past the
    sequence are read then, but never dereferenced: the K/V loads mask by the length."""
    offs = first + tl.arange(0, BLOCK_N)
    return tl.load(BLOCK_ROW + (offs.to(tl.uint32) // PAGE_SIZE) * stride_btp, mask=offs < limit, other=0)


@triton.jit
def group_rows(head_block, kv_head, GROUP: tl.constexpr, Q_LEN: tl.constexpr, BLOCK_H: tl.constexpr):
    """The query rows of one program: (token [BLOCK_H], query head [BLOCK_H], row mask [BLOCK_H]). Row r of the
    KV head's Q_LEN x GROUP rows is token r // GROUP, head kv_head * GROUP + r % GROUP (a token's heads are
    contiguous in q)."""
    offs_r = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    if Q_LEN == 1:
        return offs_r * 0, kv_head * GROUP + offs_r, offs_r < GROUP
    return offs_r // GROUP, kv_head * GROUP + offs_r % GROUP, offs_r < Q_LEN * GROUP


@triton.jit
def window_start(seqlen, window, HAS_WINDOW: tl.constexpr, Q_LEN: tl.constexpr):
    """First token any query row of a sequence can see: the window of its first new token, or 0."""
    if HAS_WINDOW:
        return tl.maximum(seqlen - Q_LEN - window, 0)
    # a literal: without a window the loop starts at a compile-time 0, as before the features
    return 0


@triton.jit
def window_starts(lens, window, HAS_WINDOW: tl.constexpr, Q_LEN: tl.constexpr):
    """``window_start`` of a block of lengths (the planner's [BLOCK] tiles): one return type, a block, either way
    (the compiler rejects a block in one branch and a literal in the other)."""
    first = lens * 0
    if HAS_WINDOW:
        # window_start's formula: calling it would compile its literal-0 return too
        first = tl.maximum(lens - Q_LEN - window, 0)
    return first


@triton.jit
def attend_group(
    Q, K, V, BLOCK_ROW, seq, kv_head, head_block, seqlen, start, end, qk_scale,
    stride_qb, stride_qt, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_btp,
    ALIBI, K_SCALE, V_SCALE, softcap, window,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_F32: tl.constexpr, USE_DOT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_WINDOW: tl.constexpr, Q_LEN: tl.constexpr,
    KV_FP8: tl.constexpr, SCALE_PTR: tl.constexpr, PREFETCH_PAGES: tl.constexpr = False,
    OFFS_I32: tl.constexpr = False, V_T: tl.constexpr = False, early_first=0, early_pages=0,
    EARLY_PAGES: tl.constexpr = False,
):  # fmt: skip
    """Attention of one head block of the Q_LEN x GROUP query rows of KV head ``kv_head`` of sequence ``seq`` (int64)
    over its tokens [start, end) of ``seqlen``: (out [BLOCK_H, BLOCK_D] fp32, lse [BLOCK_H] natural log), 0 and -inf
    for an empty range. BLOCK_ROW: the sequence's block-table row. fp8: k_scale joins the score scale, v_scale the
    output (out = v_scale * acc / l). V_T: V's pages are token-major (``v_token_major``). early_first, early_pages,
    EARLY_PAGES: the first page ids, loaded before the length (``attend_range``; head-dim-major V only)."""
    offs_d = tl.arange(0, BLOCK_D)
    row_tok, row_head, mask_h = group_rows(head_block, kv_head, GROUP, Q_LEN, BLOCK_H)
    q = load_q_rows(Q + seq * stride_qb, stride_qt, stride_qh, row_tok, row_head, mask_h, offs_d, HEAD_DIM)
    if KV_FP8:
        if SCALE_PTR:
            qk_scale = qk_scale * tl.load(K_SCALE)
        else:
            qk_scale = qk_scale * K_SCALE
    # [BLOCK_H] query position of each row: the new tokens are the last Q_LEN of the cache
    qpos = seqlen - Q_LEN + row_tok
    if HAS_ALIBI:
        slope = tl.load(ALIBI + row_head, mask=mask_h, other=0.0)
    else:
        # unused without ALiBi: any fp32 value keeps the argument typed
        slope = qk_scale
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    k_head = K + kv_head.to(tl.int64) * stride_kh
    v_head = V + kv_head.to(tl.int64) * stride_vh
    # [start, whole) walks in whole runs of token-major V, then [whole, end) token by token (attend_range's V_T 1, 2)
    whole = end
    if V_T:
        # token-major V: whole runs up to the last run boundary, then the rest of the last run token by token, in a
        # tile of one run
        whole = tl.maximum(end // RUN_C(PAGE_SIZE, BLOCK_N) * RUN_C(PAGE_SIZE, BLOCK_N), start)
    m_i, l_i, acc = attend_range(
        q, m_i, l_i, acc, k_head, v_head, BLOCK_ROW, stride_btp, start, whole, qk_scale,
        stride_kp, stride_kt, stride_vp, stride_vt, offs_d, qpos, slope, softcap, window,
        PAGE_SIZE, HEAD_DIM, BLOCK_N, DOT_F32, USE_DOT, HAS_SOFTCAP, HAS_ALIBI, HAS_WINDOW, Q_LEN, KV_FP8,
        PREFETCH_PAGES, OFFS_I32, 1 if V_T else 0, early_first, early_pages, EARLY_PAGES and not V_T,
    )  # fmt: skip
    if V_T:
        m_i, l_i, acc = attend_range(
            q, m_i, l_i, acc, k_head, v_head, BLOCK_ROW, stride_btp, whole, end, qk_scale,
            stride_kp, stride_kt, stride_vp, stride_vt, offs_d, qpos, slope, softcap, window,
            PAGE_SIZE, HEAD_DIM, TAIL_N(PAGE_SIZE, BLOCK_N), DOT_F32, USE_DOT, HAS_SOFTCAP, HAS_ALIBI, HAS_WINDOW,
            Q_LEN, KV_FP8, PREFETCH_PAGES, OFFS_I32, 2,
        )  # fmt: skip
    out, lse = finalize(m_i, l_i, acc)
    if KV_FP8:
        if SCALE_PTR:
            out = out * tl.load(V_SCALE)
        else:
            out = out * V_SCALE
    return out, lse


@triton.jit
def store_group(
    OUT, LSE, SINKS, seq, kv_head, head_block, out, lse, stride_ob, stride_ot, stride_oh, num_q_heads,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    WRITE_LSE: tl.constexpr, HAS_SINKS: tl.constexpr, Q_LEN: tl.constexpr,
):  # fmt: skip
    """Write a head block's final rows: out [BLOCK_H, BLOCK_D] in OUT's dtype (padding rows and columns masked), and
    the LSE into the contiguous [B, Q_LEN, Hq] fp32 buffer. A final result is where the sinks join (``add_sink``)."""
    offs_d = tl.arange(0, BLOCK_D)
    row_tok, row_head, mask_h = group_rows(head_block, kv_head, GROUP, Q_LEN, BLOCK_H)
    if HAS_SINKS:
        out, lse = add_sink(out, lse, tl.load(SINKS + row_head, mask=mask_h, other=0.0))
    heads = row_head.to(tl.int64)
    toks = row_tok.to(tl.int64)
    out_ptrs = OUT + seq * stride_ob + toks[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=mask_h[:, None] & (offs_d[None, :] < HEAD_DIM))
    if WRITE_LSE:
        tl.store(LSE + (seq * Q_LEN + toks) * num_q_heads + heads, lse, mask=mask_h)


@triton.jit
def finalize(m_i, l_i, acc):
    """(out [BLOCK_H, BLOCK_D] fp32, lse [BLOCK_H] natural log). Empty state (l_i = 0) gives 0 and -inf."""
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
    return out, lse


@triton.jit
def add_sink(out, lse, sink):
    """A sink logit joins the softmax denominator once: lse' = log(exp(lse) + exp(sink)), out' = out exp(lse - lse').
    out: [BLOCK_H, BLOCK_D], lse, sink: [BLOCK_H] natural log; an empty row (lse = -inf) gives 0 and lse' = sink."""
    m = tl.maximum(lse, sink)
    lse_new = m + tl.log(tl.exp(lse - m) + tl.exp(sink - m))
    return out * tl.exp(lse - lse_new)[:, None], lse_new
