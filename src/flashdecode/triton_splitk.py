"""Split-K paged decode attention (flash-decoding): partial kernel + LSE combine kernel.

Each sequence's tokens are cut into NUM_SPLITS contiguous ranges on BLOCK_N-tile edges. The partial kernel, one
program per (split, KV head, sequence), runs the online softmax over its range for the whole GQA group and writes
the normalised partial output o_s = acc_s / l_s [fp32] and its natural-log LSE lse_s = m_s + log(l_s); an empty
range writes (0, -inf). The combine kernel, one program per (query head, sequence), merges the splits:

    LSE = log(sum_s exp(lse_s)),    out = sum_s exp(lse_s - LSE) * o_s

Each partial is weighted exactly once by its softmax mass exp(lse_s) = l_s * exp(m_s). (The combine published with
the source blog post stores acc_s unnormalised and multiplies by l_s again, weighting each split by l_s twice.)

Bytes: the valid K/V once, plus 2 * B * Hq * NUM_SPLITS * (D + 1) * 4 for the fp32 partials (written, then read).
Grids: partial (NUM_SPLITS, Hkv, B); combine (Hq, B).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .triton_common import LOG2E, attend_range, dot_in_fp32, finalize, load_q_group
from .triton_single import launch_config

__all__ = ["decode_splitk", "plan_num_splits", "split_bounds", "splitk_partials_mirror"]

# splits beyond this add combine work and partial-buffer traffic for no extra parallelism on any current GPU
MAX_SPLITS = 256
# resident programs per SM that the split planner aims for (measured: docs/design.md)
PROGRAMS_PER_SM = 2
# the combine kernel reads the splits' LSEs in chunks of this many
COMBINE_BLOCK_S = 16


@triton.jit
def _partial_kernel(
    Q,
    K,
    V,
    SEQLENS,
    BLOCK_TABLE,
    O_PART,
    LSE_PART,
    qk_scale,
    stride_qb,
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
    NUM_SPLITS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_F32: tl.constexpr,
    USE_DOT: tl.constexpr,
):
    split = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)
    num_q_heads = GROUP * tl.num_programs(1)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    head0 = kv_head * GROUP

    # split boundaries on tile edges, from this sequence's own length: see split_bounds()
    seqlen = tl.load(SEQLENS + seq * stride_sl)
    tiles_per_split = tl.cdiv(tl.cdiv(seqlen, BLOCK_N), NUM_SPLITS)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, seqlen)

    q = load_q_group(Q + seq * stride_qb, stride_qh, head0, offs_h, offs_d, GROUP, HEAD_DIM)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    m_i, l_i, acc = attend_range(
        q, m_i, l_i, acc,
        K + kv_head.to(tl.int64) * stride_kh,
        V + kv_head.to(tl.int64) * stride_vh,
        BLOCK_TABLE + seq * stride_btb, stride_btp,
        start, end, qk_scale,
        stride_kp, stride_kt, stride_vp, stride_vt, offs_d,
        PAGE_SIZE, HEAD_DIM, BLOCK_N, DOT_F32, USE_DOT,
    )  # fmt: skip
    out, lse = finalize(m_i, l_i, acc)

    # partials are contiguous [B, Hq, NUM_SPLITS, BLOCK_D] and [B, Hq, NUM_SPLITS]
    mask_h = offs_h < GROUP
    rows = (seq * num_q_heads + head0 + offs_h) * NUM_SPLITS + split
    tl.store(O_PART + rows[:, None] * BLOCK_D + offs_d[None, :], out, mask=mask_h[:, None])
    tl.store(LSE_PART + rows, lse, mask=mask_h)


@triton.jit
def _combine_kernel(
    O_PART,
    LSE_PART,
    OUT,
    LSE,
    stride_ob,
    stride_oh,
    NUM_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    head = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    row = seq * tl.num_programs(0) + head
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)

    # the online softmax again, over the splits' LSEs (natural log): running max, sum and weighted output
    m_i = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), axis=0)
    l_i = tl.sum(tl.zeros([BLOCK_S], tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(0, NUM_SPLITS, BLOCK_S):
        mask_s = s0 + offs_s < NUM_SPLITS
        # [BLOCK_S]; empty splits hold -inf
        lse_s = tl.load(LSE_PART + row * NUM_SPLITS + s0 + offs_s, mask=mask_s, other=float("-inf"))
        m_new = tl.maximum(m_i, tl.max(lse_s, axis=0))
        # while every split so far is empty, measure from 0 so that exp(-inf - 0) = 0 rather than NaN
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_ref)
        w = tl.exp(lse_s - m_ref)
        # [BLOCK_S, BLOCK_D]
        o = tl.load(O_PART + (row * NUM_SPLITS + s0 + offs_s)[:, None] * BLOCK_D + offs_d[None, :], mask=mask_s[:, None], other=0.0)
        acc = acc * alpha + tl.sum(w[:, None] * o, axis=0)
        l_i = l_i * alpha + tl.sum(w, axis=0)
        m_i = m_new

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)
    out_ptrs = OUT + seq * stride_ob + head.to(tl.int64) * stride_oh + offs_d
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=offs_d < HEAD_DIM)
    if WRITE_LSE:
        tl.store(LSE + row, tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i))))


def plan_num_splits(
    batch: int, num_kv_heads: int, max_tokens: int, block_n: int, num_sms: int, programs_per_sm: int = None
) -> int:
    """How many splits per sequence so that the partial grid keeps the GPU's memory system busy.

    The single-pass grid has B * Hkv programs. A streaming program keeps only a few tiles in flight, so an SM needs
    several resident programs to approach peak bandwidth: aim for ``programs_per_sm`` programs per SM. When
    B * Hkv reaches that, no split; otherwise split each sequence, but never into more pieces than the longest
    possible sequence has tiles (max_tokens = block-table width * page_size: known on the host without reading
    the lengths, so the choice needs no device sync).
    """
    target = (PROGRAMS_PER_SM if programs_per_sm is None else programs_per_sm) * num_sms
    programs = batch * num_kv_heads
    if programs >= target:
        return 1
    max_tiles = max(1, triton.cdiv(max_tokens, block_n))
    return max(1, min(triton.cdiv(target, programs), max_tiles, MAX_SPLITS))


def split_bounds(seqlen: int, num_splits: int, block_n: int) -> list[tuple[int, int]]:
    """[start, end) of each split of one sequence, exactly as the partial kernel computes them."""
    tiles_per_split = triton.cdiv(triton.cdiv(seqlen, block_n), num_splits)
    bounds = []
    for split in range(num_splits):
        start = split * tiles_per_split * block_n
        bounds.append((start, max(start, min(start + tiles_per_split * block_n, seqlen))))
    return bounds


def decode_splitk(
    q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, out, lse=None, num_splits=2, config=None,
    return_partials=False,
):  # fmt: skip
    """Launch the partial and combine kernels.

    Args: as ``triton_single.decode_single`` (config overrides ``launch_config``), plus num_splits (>= 1) and
    return_partials (tests: also return the
    fp32 partial outputs [B, Hq, S, BLOCK_D] and LSEs [B, Hq, S]).
    """
    batch, num_q_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    assert num_splits >= 1, f"num_splits must be >= 1, got {num_splits}"
    assert lse is None or lse.is_contiguous(), "lse workspace must be contiguous [B, Hq]"
    cfg = {**launch_config(head_dim, group, q.dtype), **(config or {})}
    o_part = torch.empty(batch, num_q_heads, num_splits, cfg["BLOCK_D"], dtype=torch.float32, device=q.device)
    lse_part = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    _partial_kernel[(num_splits, num_kv_heads, batch)](
        q, k_cache, v_cache, cache_seqlens, block_table, o_part, lse_part,
        softmax_scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        cache_seqlens.stride(0), block_table.stride(0), block_table.stride(1),
        NUM_SPLITS=num_splits, GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        DOT_F32=dot_in_fp32(q.dtype),
        **cfg,
    )  # fmt: skip
    _combine_kernel[(num_q_heads, batch)](
        o_part, lse_part, out, lse if lse is not None else lse_part,
        out.stride(0), out.stride(1),
        NUM_SPLITS=num_splits, HEAD_DIM=head_dim,
        BLOCK_S=min(COMBINE_BLOCK_S, triton.next_power_of_2(num_splits)), BLOCK_D=cfg["BLOCK_D"],
        WRITE_LSE=lse is not None,
    )  # fmt: skip
    if return_partials:
        return out, lse, o_part, lse_part
    return out, lse


def splitk_partials_mirror(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, num_splits, block_n):
    """PyTorch float64 mirror of the partial kernel: the same split boundaries, each split's (o_s, lse_s).

    Returns o_part [B, Hq, S, D] and lse_part [B, Hq, S] float64 on the CPU; empty splits are (0, -inf).
    """
    from .reference import reference_dense

    batch, num_q_heads, head_dim = q.shape
    page_size = k_cache.shape[1]
    o_part = torch.zeros(batch, num_q_heads, num_splits, head_dim, dtype=torch.float64)
    lse_part = torch.full((batch, num_q_heads, num_splits), -math.inf, dtype=torch.float64)
    table = block_table.cpu().long()
    # each split's tokens as a sequence of its own, over a view of the cache as pages of one token
    flat_k = k_cache.reshape(-1, 1, *k_cache.shape[2:])
    flat_v = v_cache.reshape(-1, 1, *v_cache.shape[2:])
    for b, seqlen in enumerate(cache_seqlens.cpu().tolist()):
        for s, (start, end) in enumerate(split_bounds(seqlen, num_splits, block_n)):
            if start == end:
                continue
            tokens = torch.arange(start, end)
            pages = table[b, tokens // page_size] * page_size + tokens % page_size
            o, lse = reference_dense(
                q[b : b + 1], flat_k, flat_v, torch.tensor([end - start]), pages[None], softmax_scale
            )
            o_part[b, :, s], lse_part[b, :, s] = o[0], lse[0]
    return o_part, lse_part
