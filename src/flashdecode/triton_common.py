"""Triton helpers shared by the decode kernels, written once.

* ``load_q_group``: the [BLOCK_H, BLOCK_D] tile of query heads that share one KV head (GQA packing), with the
  padding rows and columns masked to 0 so that ``tl.dot`` can run at its minimum tile height of 16.
* ``attend_range``: the online-softmax walk over tokens [start, end) of one sequence's paged K/V, in base-2
  (scores are pre-multiplied by scale * log2(e), so exp(x) becomes exp2) with fp32 state.
* ``softmax_step``: one online-softmax update from a tile of scores (shared by every kernel's walk).
* ``finalize``: out = acc / l and the natural-log LSE, with 0 / -inf for an empty range, never NaN.

State names follow the papers: ``m_i`` running max (log2 units), ``l_i`` running sum, ``acc`` the unnormalised
output. See docs/design.md for the derivation.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

# exp(x) = exp2(x * LOG2E): the scale is folded into one multiply of the scores
LOG2E = 1.4426950408889634
# log(x) = log2(x) * LN2 (a constexpr so kernels can read it)
LN2 = tl.constexpr(0.6931471805599453)


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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
    import torch

    if not PDL or interpreting() or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


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


# below this many query heads per KV head, products run on the CUDA cores instead of tl.dot. Measured on the H200
# (scripts/sweep.py): tl.dot won even for MHA (group 1 padded to 16 rows), so every group uses it
DOT_MIN_GROUP = 1


def launch_config(head_dim: int, group: int, dtype) -> dict:
    """Tile sizes, warps and stages for one (head_dim, group, dtype): one small table, no per-call autotuning.

    Measured on the H200 (scripts/sweep.py, docs/design.md). BLOCK_N tokens per tile; K and V tiles of
    [BLOCK_N, BLOCK_D] per pipeline stage in shared memory:
    * group < 4 (MHA-like): BLOCK_N 128, 2 stages (64 KB a stage): deep tiles, few rows of work per byte;
    * group >= 4: BLOCK_N 64, 3 stages (32 KB a stage, 2 programs per SM);
    * head_dim 256: BLOCK_N halved to keep the same shared memory.
    BLOCK_H: the group, padded to 16 (the smallest tl.dot height) when products use tl.dot.
    BLOCK_D: head_dim padded to a power of two (masked).
    """
    block_d = max(16, triton.next_power_of_2(head_dim))
    use_dot = group >= DOT_MIN_GROUP
    block_n, stages = (128, 2) if group < 4 else (64, 3)
    if block_d > 128:
        block_n //= 2
    return dict(
        BLOCK_H=max(16, triton.next_power_of_2(group)) if use_dot else triton.next_power_of_2(group),
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        USE_DOT=use_dot,
        num_warps=4,
        num_stages=stages,
    )


@triton.jit
def load_q_group(Q, stride_qh, head0, offs_h, offs_d, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Load query heads head0 .. head0 + GROUP - 1 of one sequence as a [BLOCK_H, BLOCK_D] tile (Q at the row)."""
    mask = (offs_h[:, None] < GROUP) & (offs_d[None, :] < HEAD_DIM)
    ptrs = Q + (head0 + offs_h[:, None]).to(tl.int64) * stride_qh + offs_d[None, :]
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def softmax_step(m_i, l_i, s):
    """One online-softmax step over a tile of scores s [BLOCK_H, N] (log2 units, -inf for padding tokens, at least
    one finite per row after the first tile): (m_new, alpha, p, l_new) with alpha = exp2(m_i - m_new) the rescale
    of the old state and p = exp2(s - m_new) [BLOCK_H, N]. The caller updates acc = acc * alpha + p . V."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return m_new, alpha, p, l_i * alpha + tl.sum(p, axis=1)


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
    PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_F32: tl.constexpr,
    USE_DOT: tl.constexpr,
):
    """Online softmax over tokens [start, end) of one sequence and one KV head.

    q: [BLOCK_H, BLOCK_D] query tile. m_i, l_i: [BLOCK_H] fp32. acc: [BLOCK_H, BLOCK_D] fp32.
    K, V: cache pointers already offset to this KV head. BLOCK_ROW: this sequence's block-table row, stride_btp apart.
    USE_DOT: products on the tensor cores (tl.dot, BLOCK_H >= 16); otherwise broadcast-multiply and reduce on the
    CUDA cores, which wastes nothing on padding rows when the group is small (MHA: one head per KV head).
    Every tile holds at least one valid token (start < end), so m_i is finite after the first tile and the
    rescale factor exp2(m_i - m_new) is never exp2(-inf + inf).
    """
    mask_d = offs_d < HEAD_DIM
    if DOT_F32 and USE_DOT:
        q = q.to(tl.float32)
    for tile_start in range(start, end, BLOCK_N):
        offs_n = tile_start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        # token t is row t % PAGE_SIZE of page BLOCK_ROW[t // PAGE_SIZE]; entries past `end` are never read
        page = tl.load(BLOCK_ROW + (offs_n // PAGE_SIZE) * stride_btp, mask=mask_n, other=0).to(tl.int64)
        row = (offs_n % PAGE_SIZE).to(tl.int64)
        mask_kv = mask_n[:, None] & mask_d[None, :]
        # [BLOCK_N, BLOCK_D]
        k = tl.load(K + page[:, None] * stride_kp + row[:, None] * stride_kt + offs_d[None, :], mask=mask_kv, other=0.0)
        v = tl.load(V + page[:, None] * stride_vp + row[:, None] * stride_vt + offs_d[None, :], mask=mask_kv, other=0.0)
        if not USE_DOT:
            # [BLOCK_H, 1, BLOCK_D] * [1, BLOCK_N, BLOCK_D] summed over D, in fp32
            s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
        elif DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        # [BLOCK_H, BLOCK_N] scores in log2 units; padding tokens get -inf so exp2 gives exactly 0
        s = tl.where(mask_n[None, :], s * qk_scale, float("-inf"))
        m_new, alpha, p, l_i = softmax_step(m_i, l_i, s)
        if not USE_DOT:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        elif DOT_F32:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def attend_group(
    Q, K, V, BLOCK_ROW, seq, kv_head, start, end, qk_scale,
    stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_btp,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_F32: tl.constexpr, USE_DOT: tl.constexpr,
):  # fmt: skip
    """Attention of the GROUP query heads of KV head ``kv_head`` of sequence ``seq`` (int64) over its tokens
    [start, end): (out [BLOCK_H, BLOCK_D] fp32, lse [BLOCK_H] natural log), 0 and -inf for an empty range.
    BLOCK_ROW: the sequence's block-table row."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_q_group(Q + seq * stride_qb, stride_qh, kv_head * GROUP, offs_h, offs_d, GROUP, HEAD_DIM)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    m_i, l_i, acc = attend_range(
        q, m_i, l_i, acc,
        K + kv_head.to(tl.int64) * stride_kh,
        V + kv_head.to(tl.int64) * stride_vh,
        BLOCK_ROW, stride_btp, start, end, qk_scale,
        stride_kp, stride_kt, stride_vp, stride_vt, offs_d,
        PAGE_SIZE, HEAD_DIM, BLOCK_N, DOT_F32, USE_DOT,
    )  # fmt: skip
    return finalize(m_i, l_i, acc)


@triton.jit
def store_group(
    OUT, LSE, seq, kv_head, out, lse, stride_ob, stride_oh, num_q_heads,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):  # fmt: skip
    """Write a group's final rows: out [BLOCK_H, BLOCK_D] in OUT's dtype (padding rows and columns masked), and the
    LSE into the contiguous [B, Hq] fp32 buffer."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask_h = offs_h < GROUP
    heads = (kv_head * GROUP + offs_h).to(tl.int64)
    out_ptrs = OUT + seq * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=mask_h[:, None] & (offs_d[None, :] < HEAD_DIM))
    if WRITE_LSE:
        tl.store(LSE + seq * num_q_heads + heads, lse, mask=mask_h)


@triton.jit
def finalize(m_i, l_i, acc):
    """(out [BLOCK_H, BLOCK_D] fp32, lse [BLOCK_H] natural log). Empty state (l_i = 0) gives 0 and -inf."""
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
    return out, lse
