"""Single-pass paged decode attention: one Triton program per (sequence, KV head, head block).

Each program loads the query rows that share its KV head (the GROUP = Hq / Hkv heads, times q_len tokens for
multi-token queries) as one [BLOCK_H, BLOCK_D] tile, walks the sequence's visible pages BLOCK_N tokens at a time with
the online softmax, and writes the normalised output (and the LSE). With a sliding window the walk starts at the
window's first token: earlier pages are never read. When the rows exceed BLOCK_H (``launch_config``), the KV head's
rows are cut into ``ceil(rows / BLOCK_H)`` head blocks, each reading the tokens once: bytes =
2 * head_blocks * sum(visible tokens) * Hkv * D * itemsize + q + out. Grid: (Hkv * head_blocks, B). With few
sequences and heads the grid cannot fill the GPU; that is what ``triton_splitk`` is for. Its PyTorch mirror is
``triton_splitk.splitk_partials_mirror`` with one chunk per sequence (the same online softmax over the whole
sequence).
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import gluon_single
from .api import v_token_major
from .launcher import launch
from .triton_common import (
    LOG2E,
    PLAIN,
    PREFETCH_DEEP_TILE,
    PREFETCH_ONE_WAVE_TILE,
    PREFETCH_ONE_WAVE_TILE_64,
    attend_group,
    cache_offsets_fit_int32,
    cdiv,
    chain_pdl,
    dot_in_fp32,
    even_batch,
    first_page_ids,
    launch_config,
    let_next_start,
    longest_first,
    next_power_of_2,
    pages_before_lengths,
    single_pass_long_grid,
    store_group,
    tile_programs_per_sm,
    use_pdl,
    wait_for_previous,
    window_start,
)

__all__ = ["decode_single"]

# longest-first dispatch (``decode_single(longest_first=True)``) for batches of at most this many sequences: each
# program tests the lengths (a [batch] tile) before its first page-id load and sorts them when they are uneven; even
# batches pay a little. 0: never (docs/design.md, "Longest first")
LONGEST_FIRST_MAX_BATCH = 512


@triton.jit
def _decode_single_kernel(
    Q,
    K,
    V,
    SEQLENS,
    BLOCK_TABLE,
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
    tail_first,
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
    EVEN_B: tl.constexpr = 0,
    USE_PDL: tl.constexpr = False,
    LONG_MEAN: tl.constexpr = 0,
    OFFS_I32: tl.constexpr = False,
    V_T: tl.constexpr = False,
    LONGEST_B: tl.constexpr = 0,
    EVEN_SPAN: tl.constexpr = 0,
    table_tokens=0,
    EARLY_PAGES: tl.constexpr = False,
):
    """One program per (KV head x head block, sequence): grid (Hkv * HEAD_BLOCKS, B). The program attends its query
    rows (the GQA group's, up to BLOCK_H of them) over the sequence's whole visible range and writes out and LSE.

    A plain call takes the ``else`` branch below with EVEN_B = LONGEST_B = 0: sequence = program_id(1). LONGEST_B
    (0: off, else the lengths tile's width, B padded to a power of two) deals the sequences longest first instead,
    and with EVEN_SPAN (a full grid's dual path) the programs return when the batch's longest sequence outlasts a
    wave's share (``longest_first``). EVEN_B (likewise 0 or the width) is a dual-path call's single pass: its
    programs write only where the planned kernels will not (``even_batch``: an even batch, and under the tail gate
    of long sequences only those before tail_first). Shapes and the other switches: ``attend_group``.
    """
    # neighbouring programs share a KV head (its tokens stay in L2 across head blocks)
    kv_head = tl.program_id(0) // HEAD_BLOCKS
    head_block = tl.program_id(0) % HEAD_BLOCKS
    # a call's first kernel (``chain_pdl``): the kernels before it have finished
    wait_for_previous(USE_PDL)
    if EVEN_B:
        # dual-path call: the planned kernels may start now; they compute the same test, so exactly one path writes
        let_next_start(USE_PDL)
    early_pages = 0
    if LONGEST_B:
        # grid row `slot` takes the sequences longest first (a grid of several waves: longest_first)
        seq, seqlen, ours = longest_first(
            SEQLENS, stride_sl, tl.num_programs(1), tl.program_id(1), window, LONGEST_B, HAS_WINDOW, Q_LEN, EVEN_SPAN
        )  # fmt: skip
        seq = seq.to(tl.int64)
        if not ours:
            # a full grid's dual-path call (EVEN_SPAN): its longest sequence outlasts a wave's share, the planned
            # kernels write (the same test as theirs, even_batch)
            return
    else:
        seq = tl.program_id(1).to(tl.int64)
        # loaded before the test below, so that the two loads are in flight together
        seqlen = tl.load(SEQLENS + seq * stride_sl)
        if EARLY_PAGES:
            # without a window every program starts at token 0: its first page ids are loaded beside the length,
            # before any instruction waits for it
            early_row = BLOCK_TABLE + seq * stride_btb
            early_pages = first_page_ids(early_row, stride_btp, 0, table_tokens, PAGE_SIZE, BLOCK_N)
        if EVEN_B:
            even, short = even_batch(
                SEQLENS, stride_sl, tl.num_programs(1), window, EVEN_B, HAS_WINDOW, Q_LEN, LONG_MEAN, EVEN_SPAN
            )  # fmt: skip
            # under the tail gate an even batch of long sequences is ours only before tail_first (planned_from)
            if not (even & (short | (seq < tail_first))):
                return
    # (seqlen, window start, seqlen): the length and the range [start, end); early page ids from token 0 (early_first
    # 0), not after longest_first, which learns its sequence too late for them
    out, lse = attend_group(
        Q, K, V, BLOCK_TABLE + seq * stride_btb, seq, kv_head, head_block, seqlen,
        window_start(seqlen, window, HAS_WINDOW, Q_LEN), seqlen, qk_scale,
        stride_qb, stride_qt, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_btp,
        ALIBI, K_SCALE, V_SCALE, softcap, window,
        GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_H, BLOCK_N, BLOCK_D, DOT_F32, USE_DOT,
        HAS_SOFTCAP, HAS_ALIBI, HAS_WINDOW, Q_LEN, KV_FP8, SCALE_PTR, PREFETCH_PAGES, OFFS_I32, V_T,
        0, early_pages, EARLY_PAGES and not LONGEST_B,
    )  # fmt: skip
    if not EVEN_B:
        # the call's last kernel: the next call's first one may start when every program is here, not before (started
        # at the top, its waiting programs slowed this grid: H200, 64 x 4096 32/8 248 -> 283 us)
        let_next_start(USE_PDL)
    store_group(
        OUT, LSE, SINKS, seq, kv_head, head_block, out, lse, stride_ob, stride_ot, stride_oh, num_q_heads,
        GROUP, HEAD_DIM, BLOCK_H, BLOCK_D, WRITE_LSE, HAS_SINKS, Q_LEN,
    )  # fmt: skip


def as_rows(t):
    """[B, Hq, D] -> [B, 1, Hq, D] view (no copy); [B, q_len, Hq, D] unchanged."""
    return t if t.dim() == 4 else t.unsqueeze(1)


def row_strides(t) -> tuple[int, int, int]:
    """(batch, token, head) strides of ``as_rows(t)``, without building the view (~1 us of host time each)."""
    if t.dim() == 4:
        return t.stride()[:3]
    stride_b, stride_h, _ = t.stride()
    # unsqueeze(1) gives the new dim size(1) * stride(1), so the launch specialises exactly as on the view
    return stride_b, t.shape[1] * stride_h, stride_h


def single_config(head_dim, group, dtype, q_len, kv_itemsize, kv_programs, num_sms=None) -> dict:
    """The single pass's launch config: ``launch_config``'s, with ``PREFETCH_ONE_WAVE_TILE`` (``_64`` for an 8-bit
    cache or head dim 256) for a prefetching grid of at most one program per SM and ``PREFETCH_DEEP_TILE`` for one
    of more than a wave (``single_pass_long_grid``).
    kv_programs: B * Hkv (times the head blocks here)."""
    cfg = launch_config(head_dim, group, dtype, q_len, kv_itemsize, single=True)
    programs = kv_programs * cdiv(q_len * group, cfg["BLOCK_H"])
    if cfg["PREFETCH_PAGES"] and PREFETCH_ONE_WAVE_TILE and num_sms and programs <= num_sms:
        wide = kv_itemsize == 2 and cfg["BLOCK_D"] <= 128
        cfg.update(PREFETCH_ONE_WAVE_TILE if wide else PREFETCH_ONE_WAVE_TILE_64)
    elif single_pass_long_grid(cfg, programs, num_sms):
        cfg.update(PREFETCH_DEEP_TILE)
    return cfg


def decode_single(
    q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, out, lse=None, config=None, features=None,
    num_sms=None, even_only=False, long_mean=0, tail_first=0, longest_first=False, even_span=0, gluon=None,
):  # fmt: skip
    """Launch the single-pass kernel.

    Args:
        q: [B, Hq, D] or [B, q_len, Hq, D] (last dim contiguous). k_cache, v_cache: [num_pages, page_size, Hkv, D].
        cache_seqlens: [B] int32. block_table: [B, max_pages] int32.
        softmax_scale: float. out: q's shape, written in place. lse: None or contiguous fp32 of q's shape without D.
        config: overrides of ``launch_config`` entries (tests force small tiles, sweeps try others).
        features: ``triton_common.Features`` (softcap, ALiBi, sinks, window, q_len, fp8 scales); None = none.
        num_sms: the device's SM count, if known: a grid of at most that many programs takes
            ``PREFETCH_ONE_WAVE_TILE`` where the prefetching tile applies, one of more than a wave of
            ``PREFETCH_TILE_PER_SM`` per SM takes ``PREFETCH_DEEP_TILE`` (``single_pass_long_grid``).
        even_only: the first launch of a dual-path split-K call: the programs write only if the batch is even
            (``triton_common.even_batch``), and let the planned kernels that follow start at once.
        long_mean: with even_only, also only if the mean visible length is below this many tokens (0: any), and
            then, for an even batch of longer ones, still the sequences before tail_first (the tail gate's split,
            ``triton_splitk.single_pass_tail``).
        longest_first: an uneven batch's sequences are dispatched longest first (``triton_common.longest_first``),
            for grids of more programs than num_sms and batches of 2 to ``LONGEST_FIRST_MAX_BATCH`` sequences (with
            even_only, only with even_span: other dual-path batches are even).
        even_span: with even_only, a full grid's test (``triton_splitk.full_grid_span``): the programs write unless
            the longest sequence outlasts a wave's share (0: the test over the batch).
        gluon: run ``gluon_single``'s kernel instead (True: it must support the call); None: where it supports the
            call and was measured faster (``gluon_single.pays``), for calls in batch order without config overrides
            or even_only.
    """
    q_shape = q.shape
    batch, num_q_heads, head_dim = q_shape[0], q_shape[-2], q_shape[-1]
    q_len = q_shape[1] if len(q_shape) == 4 else 1
    _, page_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    features = features or PLAIN
    assert features.q_len == q_len, f"features.q_len {features.q_len} != q's q_len {q_len}"
    assert lse is None or lse.is_contiguous(), "lse workspace must be contiguous [B, (q_len,) Hq]"
    cfg = single_config(head_dim, group, q.dtype, q_len, k_cache.element_size(), batch * num_kv_heads, num_sms)
    head_blocks = cdiv(q_len * group, cfg["BLOCK_H"])
    if config:
        cfg.update(config)
        head_blocks = cdiv(q_len * group, cfg["BLOCK_H"])
    # the kernel reads q and out as [B, q_len, Hq, D] (as_rows) through these strides; no view is built
    stride_qb, stride_qt, stride_qh = row_strides(q)
    stride_ob, stride_ot, stride_oh = row_strides(out)
    stride_kp, stride_kt, stride_kh, _ = k_cache.stride()
    stride_vp, stride_vt, stride_vh, _ = v_cache.stride()
    stride_btb, stride_btp = block_table.stride()
    # natural-scale logits when softcap or ALiBi act on them; the kernel goes to log2 units afterwards
    natural = features.softcap is not None or features.alibi_slopes is not None
    # a grid of more programs than SMs runs in waves, where the order matters
    programs = batch * num_kv_heads * head_blocks
    assert not (even_span and (long_mean or not even_only)), "even_span is a full grid's dual path, without a tail"
    ordered = longest_first and (even_span or not even_only) and 1 < batch <= LONGEST_FIRST_MAX_BATCH
    ordered = ordered and programs > (num_sms or 0)
    if gluon is None:
        # supports refuses token-major V too (its head dim is not contiguous)
        gluon = not (config or even_only or ordered) and gluon_single.pays(programs, num_sms, group, features.kv_fp8)
        gluon = gluon and gluon_single.supports(q, k_cache, v_cache, cache_seqlens, block_table, features)
    elif gluon:
        assert gluon_single.supports(q, k_cache, v_cache, cache_seqlens, block_table, features), "gluon=True: see supports"
    if gluon:
        scales = dict(k_scale=features.k_scale, v_scale=features.v_scale) if features.kv_fp8 else {}
        return gluon_single.decode_single_gluon(
            q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, out, lse, **scales
        )  # fmt: skip
    # the single pass of a dual-path call is launched as before (not chained: decode_splitk)
    pdl, chain = use_pdl(q.device), chain_pdl(q.device) and not even_only
    launch(
        _decode_single_kernel, (num_kv_heads * head_blocks, batch),
        q, k_cache, v_cache, cache_seqlens, block_table, out, lse if lse is not None else out,
        qk_scale=softmax_scale * (1.0 if natural else LOG2E), num_q_heads=num_q_heads,
        tail_first=tail_first if even_only else 0, stride_qb=stride_qb, stride_qt=stride_qt, stride_qh=stride_qh,
        stride_kp=stride_kp, stride_kt=stride_kt, stride_kh=stride_kh,
        stride_vp=stride_vp, stride_vt=stride_vt, stride_vh=stride_vh,
        stride_sl=cache_seqlens.stride()[0], stride_btb=stride_btb, stride_btp=stride_btp,
        stride_ob=stride_ob, stride_ot=stride_ot, stride_oh=stride_oh,
        GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        DOT_F32=dot_in_fp32(q.dtype), WRITE_LSE=lse is not None, HEAD_BLOCKS=head_blocks,
        EVEN_B=next_power_of_2(batch) if even_only else 0, USE_PDL=chain or (pdl and even_only),
        LONG_MEAN=long_mean if even_only else 0, EVEN_SPAN=even_span,
        OFFS_I32=cache_offsets_fit_int32(k_cache, v_cache),
        V_T=v_token_major(v_cache),
        table_tokens=block_table.shape[1] * page_size, EARLY_PAGES=pages_before_lengths(cfg, features),
        LONGEST_B=next_power_of_2(batch) if ordered else 0,
        **features.kernel_args(cache_seqlens), **cfg, **({"launch_pdl": True} if chain else {}),
        programs_per_sm=tile_programs_per_sm(cfg, programs, num_sms),
    )  # fmt: skip
    return out, lse
