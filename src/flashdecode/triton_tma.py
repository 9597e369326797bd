"""Split-K paged decode attention with K/V tiles moved by the tensor memory accelerator (Hopper and newer).

The same cut and merge as ``triton_splitk`` (its device planner ``_plan_kernel`` and LSE ``_combine_kernel``,
imported, not copied), with a different partial kernel: one program per (chunk, KV head) walks its chunk
PAGES_PER_TILE pages at a time, and every page arrives as one TMA box of [1, page_size, 1, BLOCK_D] from a host
tensor descriptor over the cache viewed as its own 4-D shape [num_pages, page_size, Hkv, D]. Hopper has no TMA
gather, so a tile is PAGES_PER_TILE boxes, one per page id read from the block table. The loop over tiles is
software-pipelined by Triton (``num_stages`` buffers: the next tiles' boxes are in flight while the current one is
consumed), and the planner aims at PROGRAMS_PER_SM resident programs per SM instead of triton_splitk's 4.

Per tile, each page's scores are one [BLOCK_H, page_size] ``tl.dot`` straight from the shared-memory box; the
pages' scores are joined into one [BLOCK_H, BLOCK_N] tile for the online-softmax step (``softmax_step``), and p is
split back into pages for the p . V products, so K and V never leave shared memory for a layout change. Tokens of
a joined tile are interleaved (join then reshape); the order is irrelevant to max, sum and p . V, and the scores
and values of a page always travel together.

Only the last tile of a chunk can hold tokens past the sequence's end: full tiles run unmasked, the tail tile
masks scores to -inf and V rows to 0 (rows past the end of the last page may hold anything, NaN included), and a
page past the end is fetched at a page id outside the pool, which TMA fills with zeros without touching memory.

Bytes: as triton_splitk (the valid K/V once, plus the fp32 partials of multi-chunk sequences).
Grids: planner (slots / 64); partial (slots, Hkv) with slots = B + ceil(2 * PROGRAMS_PER_SM * #SMs / Hkv); combine
(Hq, B). Nothing on the host reads the lengths: CUDA-graph safe like triton_splitk.

TMA limits checked before any launch (``check_supported``): compute capability >= 9.0 (or the interpreter),
page_size a power of two in [16, 256] (a box dimension is at most 256 and a page's scores are one tl.dot of
width >= 16), head_dim <= 256, 16-byte aligned cache base pointers and strides.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .api import v_token_major
from .triton_common import (
    LOG2E,
    cdiv,
    dot_in_fp32,
    finalize,
    group_rows,
    interpreting,
    load_q_rows,
    next_power_of_2,
    softmax_step,
)
from .triton_splitk import (
    MAX_PLANNED_BATCH,
    launch_combine,
    launch_plan,
    locate_chunk,
    narrow_cut,
    num_candidates,
    store_chunk,
)

__all__ = ["decode_tma", "tma_config", "check_supported", "grid_slots", "PROGRAMS_PER_SM"]

# the planner's target of resident programs per SM (the source's "two blocks per SM, grid about 2x the SM count")
PROGRAMS_PER_SM = 2
# TMA: every box dimension is at most 256 elements; global strides and base addresses are 16-byte aligned
MAX_BOX = 256
TMA_ALIGN_BYTES = 16
# a page's scores are one tl.dot of [BLOCK_H, D] x [D, page_size]; tl.dot needs every dimension >= 16
MIN_PAGE_SIZE = 16


@triton.jit
def _tile_pages(BLOCK_ROW, stride_btp, page_index, end, num_pages, PAGES: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """Pool ids [PAGES] int32 of the sequence's pages page_index .. page_index + PAGES - 1. A page past the end gets
    ``num_pages``, a coordinate outside the pool that TMA fills with zeros: table entries past the end are never
    read."""
    offs_p = page_index + tl.arange(0, PAGES)
    return tl.load(BLOCK_ROW + offs_p * stride_btp, mask=offs_p * PAGE_SIZE < end, other=num_pages)


@triton.jit
def _pick(pages, J: tl.constexpr, PAGES: tl.constexpr):
    """Element J of the [PAGES] vector ``pages`` as a scalar."""
    return tl.sum(tl.where(tl.arange(0, PAGES) == J, pages, 0), axis=0)


@triton.jit
def _tile_scores(
    q, K_DESC, pages, page_index, kv_head, end, qk_scale,
    J: tl.constexpr, PAGES: tl.constexpr, TILE_PAGES: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_F32: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """Scores [BLOCK_H, PAGES * PAGE_SIZE] (log2 units) of q [BLOCK_H, BLOCK_D] against the tile's pages J ..
    J + PAGES - 1 (pages: the tile's [TILE_PAGES] pool ids; page_index: the tile's first page in the sequence), one
    TMA box and one tl.dot per page; tokens interleaved as ``_tile_values`` splits them. MASKED: tokens at or past
    ``end`` score -inf."""
    if PAGES == 1:
        page = _pick(pages, J, TILE_PAGES)
        # [1, PAGE_SIZE, 1, BLOCK_D] box -> [PAGE_SIZE, BLOCK_D]
        k = K_DESC.load([page, 0, kv_head, 0]).reshape(PAGE_SIZE, BLOCK_D)
        if DOT_F32:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * qk_scale
        if MASKED:
            offs_t = (page_index + J) * PAGE_SIZE + tl.arange(0, PAGE_SIZE)
            s = tl.where(offs_t[None, :] < end, s, float("-inf"))
        return s
    else:
        half: tl.constexpr = PAGES // 2
        a = _tile_scores(
            q, K_DESC, pages, page_index, kv_head, end, qk_scale,
            J, half, TILE_PAGES, PAGE_SIZE, BLOCK_H, BLOCK_D, DOT_F32, MASKED,
        )  # fmt: skip
        b = _tile_scores(
            q, K_DESC, pages, page_index, kv_head, end, qk_scale,
            J + half, half, TILE_PAGES, PAGE_SIZE, BLOCK_H, BLOCK_D, DOT_F32, MASKED,
        )  # fmt: skip
        # [BLOCK_H, n] x 2 -> [BLOCK_H, n, 2] -> [BLOCK_H, 2n]: a and b interleaved
        return tl.join(a, b).reshape(BLOCK_H, PAGES * PAGE_SIZE)


@triton.jit
def _tile_values(
    p, V_DESC, pages, page_index, kv_head, end,
    J: tl.constexpr, PAGES: tl.constexpr, TILE_PAGES: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_F32: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """p . V [BLOCK_H, BLOCK_D] fp32 for p [BLOCK_H, PAGES * PAGE_SIZE] laid out as ``_tile_scores`` returns it for
    the same pages. MASKED: V rows at or past ``end`` count as 0 (p is 0 there, but 0 * NaN would not be)."""
    if PAGES == 1:
        page = _pick(pages, J, TILE_PAGES)
        v = V_DESC.load([page, 0, kv_head, 0]).reshape(PAGE_SIZE, BLOCK_D)
        if MASKED:
            offs_t = (page_index + J) * PAGE_SIZE + tl.arange(0, PAGE_SIZE)
            v = tl.where(offs_t[:, None] < end, v, 0.0)
        if DOT_F32:
            return tl.dot(p, v.to(tl.float32), input_precision="ieee")
        return tl.dot(p.to(v.dtype), v)
    else:
        half: tl.constexpr = PAGES // 2
        # the inverse of _tile_scores' join: [BLOCK_H, 2n] -> [BLOCK_H, n, 2] -> two [BLOCK_H, n]
        pa, pb = p.reshape(BLOCK_H, half * PAGE_SIZE, 2).split()
        a = _tile_values(
            pa, V_DESC, pages, page_index, kv_head, end,
            J, half, TILE_PAGES, PAGE_SIZE, BLOCK_H, BLOCK_D, DOT_F32, MASKED,
        )  # fmt: skip
        b = _tile_values(
            pb, V_DESC, pages, page_index, kv_head, end,
            J + half, half, TILE_PAGES, PAGE_SIZE, BLOCK_H, BLOCK_D, DOT_F32, MASKED,
        )  # fmt: skip
        return a + b


@triton.jit
def _attend_tile(
    q, m_i, l_i, acc, K_DESC, V_DESC, pages, page_index, kv_head, end, qk_scale,
    PAGES: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_F32: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One online-softmax step over the tile of PAGES pages whose pool ids are pages [PAGES] and whose first page in
    the sequence is page_index: the new (m_i, l_i, acc)."""
    s = _tile_scores(
        q, K_DESC, pages, page_index, kv_head, end, qk_scale,
        0, PAGES, PAGES, PAGE_SIZE, BLOCK_H, BLOCK_D, DOT_F32, MASKED,
    )  # fmt: skip
    m_new, alpha, p, l_i = softmax_step(m_i, l_i, s)
    pv = _tile_values(
        p, V_DESC, pages, page_index, kv_head, end,
        0, PAGES, PAGES, PAGE_SIZE, BLOCK_H, BLOCK_D, DOT_F32, MASKED,
    )  # fmt: skip
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _tma_partial_kernel(
    Q,
    K_DESC,
    V_DESC,
    SEQLENS,
    BLOCK_TABLE,
    PLAN,
    O_PART,
    LSE_PART,
    OUT,
    LSE,
    qk_scale,
    batch,
    max_chunks,
    num_pages,
    stride_qb,
    stride_qh,
    stride_sl,
    stride_btb,
    stride_btp,
    stride_ob,
    stride_oh,
    NUM_SPLITS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGES_PER_TILE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_F32: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    WARP_SPEC: tl.constexpr = False,
):
    BLOCK_N: tl.constexpr = PAGES_PER_TILE * PAGE_SIZE
    kv_head = tl.program_id(1)
    num_q_heads = GROUP * tl.num_programs(1)
    # grid slot -> its chunk, and the chunk id its partials go to
    seq, _, start, end, single, chunk_id = locate_chunk(
        PLAN, SEQLENS, stride_sl, tl.program_id(0), batch, max_chunks, 0, NUM_SPLITS, BLOCK_N
    )
    if seq >= batch:
        return
    seq = seq.to(tl.int64)
    block_row = BLOCK_TABLE + seq * stride_btb

    offs_d = tl.arange(0, BLOCK_D)
    # [BLOCK_H, BLOCK_D]: the GROUP query heads of this KV head, padding rows 0
    row_tok, row_head, mask_h = group_rows(0, kv_head, GROUP, 1, BLOCK_H)
    q = load_q_rows(Q + seq * stride_qb, 0, stride_qh, row_tok, row_head, mask_h, offs_d, HEAD_DIM)
    if DOT_F32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)

    # chunks start on tile edges (chunk sizes are BLOCK_N * 2^k, fixed splits whole tiles): only the last tile
    # can reach past the end
    first_page = start // PAGE_SIZE
    num_full = (end - start) // BLOCK_N
    # the next tile's page ids are loaded one iteration ahead, so that the TMA loads depend on no load of their own
    # iteration and Triton's pipeliner can run them num_stages - 1 tiles ahead (an in-iteration table load costs
    # the pipeline a stage: the K/V buffers drop to one)
    pages = _tile_pages(block_row, stride_btp, first_page, end, num_pages, PAGES_PER_TILE, PAGE_SIZE)
    # WARP_SPEC: Triton's automatic warp specialization of the loop (a producer warp group issuing the TMA loads);
    # probed on the H200 (scripts/ws_probe.py), off by default
    for i in tl.range(0, num_full, warp_specialize=WARP_SPEC):
        page_index = first_page + i * PAGES_PER_TILE
        next_pages = _tile_pages(
            block_row, stride_btp, page_index + PAGES_PER_TILE, end, num_pages, PAGES_PER_TILE, PAGE_SIZE
        )
        m_i, l_i, acc = _attend_tile(
            q, m_i, l_i, acc, K_DESC, V_DESC, pages, page_index, kv_head, end, qk_scale,
            PAGES_PER_TILE, PAGE_SIZE, BLOCK_H, BLOCK_D, DOT_F32, False,
        )  # fmt: skip
        pages = next_pages
    if start + num_full * BLOCK_N < end:
        m_i, l_i, acc = _attend_tile(
            q, m_i, l_i, acc, K_DESC, V_DESC, pages, first_page + num_full * PAGES_PER_TILE, kv_head, end, qk_scale,
            PAGES_PER_TILE, PAGE_SIZE, BLOCK_H, BLOCK_D, DOT_F32, True,
        )  # fmt: skip
    out, lse = finalize(m_i, l_i, acc)
    # no sinks, one query token, one head block: LSE_PART stands in for the unused sink pointer
    store_chunk(
        O_PART, LSE_PART, OUT, LSE, LSE_PART, chunk_id, seq, kv_head, 0, out, lse, single, stride_ob, 0, stride_oh,
        num_q_heads, GROUP, HEAD_DIM, BLOCK_H, BLOCK_D, WRITE_LSE, False, 1,
    )  # fmt: skip


def tma_config(head_dim: int, group: int, page_size: int) -> dict:
    """Launch parameters for one (head_dim, group, page_size): one small table, no per-call autotuning.

    * PAGES_PER_TILE: pages (TMA boxes) per loop iteration, so that a tile is 64 tokens (at least one page),
      32 for head_dim > 128 to keep the same shared memory.
    * num_stages 3: the pipeliner keeps num_stages - 1 = 2 K/V tiles in shared memory (double buffering: the next
      tile's boxes land while the current one is consumed); bf16, D 128, 64 tokens: 32 KB a tile, ~70 KB a program
      (checked by compiling for sm_90 in tests/test_tma.py), so PROGRAMS_PER_SM = 2 programs fit an SM's 228 KB.
    * num_warps 4; BLOCK_H: the group padded to 16 (the smallest tl.dot height); BLOCK_D: head_dim padded to a power
      of two (TMA fills the padding columns with zeros).
    * PROGRAMS_PER_SM: the planner's target of resident programs per SM.
    To be tuned on the H200 (scripts/gpu_tma.sh sweeps every entry).
    """
    block_d = max(16, next_power_of_2(head_dim))
    tile = 64
    if block_d > 128:
        tile //= 2
    return dict(
        PAGES_PER_TILE=max(1, tile // page_size),
        BLOCK_H=max(16, next_power_of_2(group)),
        BLOCK_D=block_d,
        num_warps=4,
        num_stages=3,
        PROGRAMS_PER_SM=PROGRAMS_PER_SM,
    )


def grid_slots(batch: int, num_kv_heads: int, num_sms: int, programs_per_sm: int) -> int:
    """Chunk slots of the planned grid: one per sequence plus 2 * programs_per_sm programs per SM (the planner's
    room to split; it never uses more). Sized from B and the SM count, never from the lengths."""
    return batch + cdiv(2 * programs_per_sm * num_sms, num_kv_heads)


def check_supported(q, k_cache, v_cache):
    """Raise ValueError naming the argument and value when the TMA kernel cannot run these tensors (see the module
    docstring); called before any launch, on tensors that already passed ``decode_attention``'s validation."""
    if q.is_cuda:
        major, minor = torch.cuda.get_device_capability(q.device)
        if major < 9:
            raise ValueError(
                f"backend 'triton_tma' needs a GPU of compute capability >= 9.0 (Hopper or newer, for TMA), got "
                f"{major}.{minor} ({torch.cuda.get_device_name(q.device)}); use backend 'triton_splitk'"
            )
    elif not interpreting():
        raise ValueError(f"backend 'triton_tma' needs CUDA tensors (or TRITON_INTERPRET=1), got device {q.device}")
    page_size, head_dim = k_cache.shape[1], k_cache.shape[3]
    if page_size & (page_size - 1) or not MIN_PAGE_SIZE <= page_size <= MAX_BOX:
        raise ValueError(
            f"k_cache page_size must be a power of two in [{MIN_PAGE_SIZE}, {MAX_BOX}] for backend 'triton_tma' "
            f"(one TMA box and one tl.dot per page), got {page_size}"
        )
    if head_dim > MAX_BOX:
        raise ValueError(
            f"head_dim must be <= {MAX_BOX} for backend 'triton_tma' (a TMA box dimension), got {head_dim}"
        )
    if v_token_major(v_cache):
        raise ValueError(
            "backend 'triton_tma' reads V in TMA boxes of head-dim rows, so v_cache must have a contiguous head "
            f"dim, got token-major pages (strides {tuple(v_cache.stride())}); use backend 'triton' or 'triton_splitk'"
        )
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        byte_strides = [s * t.element_size() for s in t.stride()[:-1]]
        if t.data_ptr() % TMA_ALIGN_BYTES or any(s % TMA_ALIGN_BYTES for s in byte_strides):
            raise ValueError(
                f"{name} must have a {TMA_ALIGN_BYTES}-byte aligned base address and strides for backend "
                f"'triton_tma' (TMA), got address {t.data_ptr():#x} and byte strides {byte_strides}"
            )


def _descriptor(cache, page_size, block_d):
    """Host TMA descriptor over a [num_pages, page_size, Hkv, D] cache (its own strides): one box per page and KV
    head, [1, page_size, 1, block_d]."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(cache, list(cache.shape), list(cache.stride()), [1, page_size, 1, block_d])


def decode_tma(
    q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, out, lse=None, num_splits=None, num_sms=None,
    config=None, return_partials=False,
):  # fmt: skip
    """Launch the planner, the TMA partial kernel and the combine.

    Args:
        q: [B, Hq, D] (last dim contiguous). k_cache, v_cache: [num_pages, page_size, Hkv, D], q's dtype, passing
            ``check_supported``. cache_seqlens: [B] int32. block_table: [B, max_pages] int32.
        softmax_scale: float. out: [B, Hq, D] written in place. lse: None or contiguous [B, Hq] fp32.
        num_splits: None plans on the device (B <= triton_splitk.MAX_PLANNED_BATCH); S >= 1 cuts every sequence
            into S pieces on tile edges (``triton_splitk.split_bounds`` with block_n = PAGES_PER_TILE * page_size).
        num_sms: SMs to plan for; defaults to the device's (16 under the interpreter).
        config: overrides of ``tma_config`` entries (tests force small tiles, the GPU sweep tries others).
        return_partials: also return the fp32 partials o_part [chunks, Hq, BLOCK_D] and lse_part [chunks, Hq]
            (single-chunk sequences of the planned mode leave their rows unset).
    """
    batch, num_q_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    assert num_splits is None or num_splits >= 1, f"num_splits must be None or >= 1, got {num_splits}"
    assert num_splits is not None or batch <= MAX_PLANNED_BATCH, f"planned mode takes B <= {MAX_PLANNED_BATCH}"
    assert lse is None or lse.is_contiguous(), "lse workspace must be contiguous [B, Hq]"
    cfg = {**tma_config(head_dim, group, page_size), **(config or {})}
    programs_per_sm = cfg.pop("PROGRAMS_PER_SM")
    block_n = cfg["PAGES_PER_TILE"] * page_size
    assert block_n & (block_n - 1) == 0, f"PAGES_PER_TILE * page_size must be a power of two, got {block_n}"
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 16
    if num_splits is None:
        chunks, fixed = grid_slots(batch, num_kv_heads, num_sms, programs_per_sm), 0
        max_tokens = block_table.shape[1] * page_size
        num_cand = num_candidates(max_tokens, block_n)
        plan = launch_plan(
            cache_seqlens, num_kv_heads, num_sms, chunks, block_n, num_cand, programs_per_sm,
            narrow=narrow_cut(batch, max_tokens, num_kv_heads),
        )  # fmt: skip
    else:
        chunks, fixed = batch * num_splits, num_splits
        # fixed mode never reads the plan
        plan = torch.empty(4, chunks + batch, dtype=torch.int32, device=q.device)
    o_part = torch.empty(chunks, num_q_heads, cfg["BLOCK_D"], dtype=torch.float32, device=q.device)
    lse_part = torch.empty(chunks, num_q_heads, dtype=torch.float32, device=q.device)
    _tma_partial_kernel[(chunks, num_kv_heads)](
        q, _descriptor(k_cache, page_size, cfg["BLOCK_D"]), _descriptor(v_cache, page_size, cfg["BLOCK_D"]),
        cache_seqlens, block_table, plan, o_part, lse_part, out, lse if lse is not None else lse_part,
        softmax_scale * LOG2E, batch, chunks, num_pages,
        q.stride(0), q.stride(1), cache_seqlens.stride(0), block_table.stride(0), block_table.stride(1),
        out.stride(0), out.stride(1),
        NUM_SPLITS=fixed, GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        DOT_F32=dot_in_fp32(q.dtype), WRITE_LSE=lse is not None,
        **cfg,
    )  # fmt: skip
    launch_combine(o_part, lse_part, out, lse, plan, chunks, fixed)
    if return_partials:
        return out, lse, o_part, lse_part
    return out, lse
