"""Single-pass paged decode attention: one Triton program per (sequence, KV head).

Each program loads the GROUP = Hq / Hkv query heads that share its KV head as one [BLOCK_H, BLOCK_D] tile,
walks the sequence's pages BLOCK_N tokens at a time with the online softmax, and writes the normalised output
(and the LSE). Every valid K/V byte is read exactly once: bytes = 2 * sum(seqlens) * Hkv * D * itemsize
+ q + out. Grid: (Hkv, B). With few sequences and heads the grid cannot fill the GPU; that is what
``triton_splitk`` is for. Its PyTorch mirror is ``triton_splitk.splitk_partials_mirror`` with one chunk per
sequence (the same online softmax over the whole sequence).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import LOG2E, attend_group, dot_in_fp32, launch_config, store_group

__all__ = ["decode_single"]


@triton.jit
def _decode_single_kernel(
    Q,
    K,
    V,
    SEQLENS,
    BLOCK_TABLE,
    OUT,
    LSE,
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
    stride_ob,
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
):
    kv_head = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    seqlen = tl.load(SEQLENS + seq * stride_sl)
    out, lse = attend_group(
        Q, K, V, BLOCK_TABLE + seq * stride_btb, seq, kv_head, 0, seqlen, qk_scale,
        stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_btp,
        GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_H, BLOCK_N, BLOCK_D, DOT_F32, USE_DOT,
    )  # fmt: skip
    store_group(
        OUT, LSE, seq, kv_head, out, lse, stride_ob, stride_oh, GROUP * tl.num_programs(0),
        GROUP, HEAD_DIM, BLOCK_H, BLOCK_D, WRITE_LSE,
    )  # fmt: skip


def decode_single(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, out, lse=None, config=None):
    """Launch the single-pass kernel.

    Args:
        q: [B, Hq, D] (last dim contiguous). k_cache, v_cache: [num_pages, page_size, Hkv, D].
        cache_seqlens: [B] int32. block_table: [B, max_pages] int32.
        softmax_scale: float. out: [B, Hq, D] written in place. lse: None or contiguous [B, Hq] fp32.
        config: overrides of ``launch_config`` entries (tests force small tiles, sweeps try others).
    """
    batch, num_q_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    assert lse is None or lse.is_contiguous(), "lse workspace must be contiguous [B, Hq]"
    cfg = {**launch_config(head_dim, group, q.dtype), **(config or {})}
    _decode_single_kernel[(num_kv_heads, batch)](
        q, k_cache, v_cache, cache_seqlens, block_table, out, lse if lse is not None else out,
        softmax_scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        cache_seqlens.stride(0),
        block_table.stride(0), block_table.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        DOT_F32=dot_in_fp32(q.dtype), WRITE_LSE=lse is not None,
        **cfg,
    )  # fmt: skip
    return out, lse
