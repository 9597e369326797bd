"""One-launch log-sum-exp merge of the partial results gathered from every rank (context-parallel decode).

Input: [world, B, Hq, D + 1] fp32, rank r's partial output in [..., :D] and its LSE in [..., D]. Each program
merges BLOCK_R rows (a row = one (sequence, query head)) over the ranks with the online-softmax recurrence on
the LSEs (m running max, l running sum of weights, acc weighted outputs) and writes out [B, Hq, D] in the
output dtype and lse [B, Hq] fp32. Bytes: reads world * B * Hq * (D + 1) * 4, writes B * Hq * (D * itemsize + 4).
Grid: (ceil(B * Hq / BLOCK_R),). Its PyTorch mirror is ``distributed.merge_gathered(..., merge="torch")``
(``merge_states`` folded pairwise), which the tests hold it to.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .triton_common import LN2, cdiv, interpreting, next_power_of_2

__all__ = ["merge_gathered_triton", "interpreting"]

# exp(x) = exp2(x * LOG2E) (a constexpr so the kernel can read it)
LOG2E = tl.constexpr(1.4426950408889634)

# rows per program: a [16, 128] fp32 tile is 8 KB of registers per rank step, and B * Hq is small at decode
BLOCK_R = 16


@triton.jit
def _merge_gathered_kernel(
    GATHERED,
    OUT,
    LSE,
    world,
    rows,
    stride_w,
    HEAD_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    mask_r = offs_r < rows
    mask_rd = mask_r[:, None] & (offs_d[None, :] < HEAD_DIM)
    # a row of the packed buffer is D + 1 floats
    rank_ptrs = GATHERED + offs_r.to(tl.int64) * (HEAD_DIM + 1)
    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for _ in range(world):
        # LSEs in log2 units: exp(x) = exp2(x * LOG2E); -inf stays -inf
        lse_r = tl.load(rank_ptrs + HEAD_DIM, mask=mask_r, other=float("-inf")) * LOG2E  # [BLOCK_R]
        m_new = tl.maximum(m_i, lse_r)
        # every rank so far empty: measure from 0 so that exp2(-inf - m) is 0, not NaN
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(lse_r - m_ref)  # [BLOCK_R], exactly 0 for an empty rank
        o_r = tl.load(rank_ptrs[:, None] + offs_d[None, :], mask=mask_rd, other=0.0)  # [BLOCK_R, BLOCK_D]
        # an empty rank's output may hold anything (NaN included): dropped, not multiplied by 0
        acc = acc * alpha[:, None] + tl.where(p[:, None] > 0, p[:, None] * o_r, 0.0)
        l_i = l_i * alpha + p
        m_i = m_new
        # the next rank's block of B * Hq rows
        rank_ptrs += stride_w
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
    out_ptrs = OUT + offs_r.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=mask_rd)
    tl.store(LSE + offs_r, lse, mask=mask_r)


def merge_gathered_triton(gathered: torch.Tensor, dtype: torch.dtype):
    """(out [B, Hq, D] in ``dtype``, lse [B, Hq] fp32) from gathered [world, B, Hq, D + 1] fp32 (contiguous)."""
    assert gathered.dtype == torch.float32 and gathered.dim() == 4, (
        f"gathered must be fp32 [W, B, Hq, D + 1], got {gathered.dtype} {tuple(gathered.shape)}"
    )
    assert gathered.is_contiguous(), "gathered must be contiguous (the kernel computes row addresses)"
    world, batch, num_q_heads, head_dim = gathered.shape[0], gathered.shape[1], gathered.shape[2], gathered.shape[3] - 1
    out = torch.empty(batch, num_q_heads, head_dim, dtype=dtype, device=gathered.device)
    lse = torch.empty(batch, num_q_heads, dtype=torch.float32, device=gathered.device)
    rows = batch * num_q_heads
    if rows == 0:
        return out, lse
    grid = (cdiv(rows, BLOCK_R),)
    # Triton launches on the current device: gathered's, for a model split over GPUs in one process
    with torch.cuda.device(gathered.device) if gathered.is_cuda else contextlib.nullcontext():
        _merge_gathered_kernel[grid](
            gathered, out, lse, world, rows, gathered.stride(0),
            HEAD_DIM=head_dim, BLOCK_R=BLOCK_R, BLOCK_D=max(16, next_power_of_2(head_dim)),
        )  # fmt: skip
    return out, lse
