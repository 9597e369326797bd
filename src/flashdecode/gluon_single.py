"""The single pass written in Gluon (Triton's explicit-layout dialect) for the grouped decode rows it is faster on.

The same algorithm as ``triton_single`` (one program per (sequence, KV head) walks the sequence's pages with the
online softmax and writes the normalised output and the LSE; mirror: ``triton_splitk.splitk_partials_mirror`` with
one chunk a sequence), with the layouts that Triton's compiler picks for the ``tl`` kernel written out, and two
differences that its ``tl`` form cannot express in Triton 3.6:

* q stays in registers. The ``tl`` kernel's q . K^T takes q from shared memory at every step (8 of its 32-token
  loop's 18 ``LDSM`` re-read the same 16 x 128 q tile); here q is converted once to the MMA's A-operand layout.
* the K and V tiles are gathered through the block table by ``cp.async`` copies into a ring of STAGES buffers that
  the loop waits on itself (STAGES - 1 steps in flight), with the page ids loaded a step ahead; a copy past the
  sequence's end writes zeros (a source size of 0), so no page past a length is read.

An fp8 cache (e4m3 / e5m2) runs its products in fp16, as the tl kernel's (q saturated at +-65504, k_scale in the
score scale, v_scale on the output). K^T's operand is read straight from the 8-bit ring (4 consecutive head-dim
bytes a 32-bit load) and converted in registers; V, whose operand wants pairs of consecutive tokens that ldmatrix
cannot transpose out of 8-bit rows, is read in 16-byte rows, converted and staged as fp16 for its operand loads.

Bytes per call: 2 * sum(lengths) * Hkv * D * itemsize (K and V once) + q + out (+ the LSE). Grid: (B, Hkv), 4 warps,
32-token steps. What it takes (``supports``): one query token, a cache of q's dtype (fp16 / bf16) or of fp8 in the
NHD page layout, head dim 128, groups of 1 to 16 query heads a KV head, no softcap, ALiBi, sinks or window, offsets
that fit 32 bits, pools 16-byte aligned with strides of multiples of 16 elements; on an sm_80+ GPU (sm_90+ for fp8),
compiled (Gluon kernels do not run under TRITON_INTERPRET, so the CPU tests compile it for sm_90 and the H200 suite
runs it). Where ``decode_single`` takes it (``pays``): docs/design.md, "A Gluon single pass in the library".
"""

from __future__ import annotations

import torch

from . import triton_common
from .launcher import launch, workspace
from .triton_common import (
    LN2,
    LOG2E,
    PLAIN,
    _capability_major,
    cache_offsets_fit_int32,
    chain_pdl,
    interpreting,
    use_pdl,
)

import triton

try:  # Gluon ships with Triton >= 3.5's experimental package; without it the tl single pass runs
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

__all__ = ["decode_single_gluon", "fits", "pays", "supports"]

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# Gluon is experimental and its API moves between releases: the kernel runs only on the Triton versions it was
# compiled and tested with (the H200 image's and CI's 3.6); on others decode_single keeps the tl kernel
TESTED_TRITON = ("3.6.",)

# tokens a step: a [16, 32] score tile, the K and V steps 8 KB each at head dim 128
BLOCK_N = 32
HEAD_DIM = 128
# the most query heads a KV head: the MMA's 16 rows
MAX_GROUP = 16
# ring buffers: STAGES - 1 steps in flight while one is read. H200 (scripts/gluon_probe.py, h200-2026-11-30/gluon-*):
# 2 buffers took 256 x 256 12/2 in 18.62-18.85 µs, 3 in 20.05-20.48 (why the third loses was not established)
STAGES = 2
# decode_single takes this kernel for grids of GLUON_MIN_PER_SM to GLUON_MAX_PER_SM programs a SM (the Gluon kernel
# runs 4 a SM) and groups of at least GLUON_MIN_GROUP query heads a KV head: where it was measured faster than the tl
# single pass. H200, graph µs, tl -> Gluon (h200-2026-11-30/gluon-gate-03970a1, both kernels in one process):
# 3.88 programs a SM 256 x 256 12/2 20.06 -> 19.17, 64 x 4096 32/8 245.22 -> 242.86, 128 x 512 28/4 35.41 -> 34.43;
# 7.76: 512 x 256 12/2 39.34 -> 36.12, 128 x 1024 16/8 126.79 -> 124.90; 11.64: 768 x 1024 12/2 191.16 -> 188.21.
# It loses at 1.94 a SM and fewer (128 x 1024 12/2 36.20 -> 37.28, one wave 64 x 1024 12/2 20.04 -> 27.41; deeper rings
# and longer steps do not recover it, gluon-gate-e76ff69), is mixed at 2.91 (192 x 256 12/2 0.986x, 192 x 1024 1.020x)
# and at 15.5 (1024 x 1024 12/2 0.990x here, 256 x 2048 32/8 1.006x in gluon-26bab2b), and with one query head a KV
# head at 5.8 a SM (64 x 1024 12/12 93.5 -> 100.1 µs in the anchor grid, warm-6558f8c). 0: never (fp8 caches too)
GLUON_MIN_PER_SM = 3.5
GLUON_MAX_PER_SM = 12.0
GLUON_MIN_GROUP = 2
# an fp8 cache: from GLUON_FP8_MIN_PER_SM to GLUON_FP8_MAX_PER_SM programs a SM, any group. H200, e4m3, graph µs,
# the plan without this kernel for fp8 (tl single pass or splits) -> its fp8 form (FP8_BLOCK_N x FP8_STAGES, v_perm,
# FP8_MAXNREG; h200-2026-11-30/vperm-b0ecb2c, one process): 1.94 a SM 128 x 1024 12/2 25.10 -> 22.23; 2.91 192 x 1024
# 12/2 43.82 -> 29.23; 3.88 64 x 4096 32/8 163.87 -> 137.90, 256 x 256 12/2 17.96 -> 12.00; 5.82 64 x 1024 12/12
# 79.67 -> 64.31; 7.76 128 x 2048 32/8 167.79 -> 141.66, 512 x 1024 12/2 90.15 -> 74.86; 15.52 1024 x 256 12/2
# 58.99 -> 44.63. At one wave (0.97) it is mixed against the plan's splits: 64 x 1024 12/2 15.42 -> 16.17, 32 x 512
# 28/4 10.45 -> 9.71, 32 x 2048 28/4 25.92 -> 30.09. At 1.45 it beats the tl single pass (gate-62026a7: 96 x 1024
# 12/2 23.40 -> 20.43, 16 x 4096 12/12 98.75 -> 70.87; the plan takes splits there, 29.22 and 96.99). 0: never for fp8
GLUON_FP8_MIN_PER_SM = 1.4
GLUON_FP8_MAX_PER_SM = 16.0
GLUON_FP8_MIN_GROUP = 1
# an fp8 cache's step: 64 tokens (8 KB of K and of V, as bf16's 32) in 2 buffers, V by v_perm, and at most 128
# registers a thread so that 4 programs share a SM (the step compiles to 133 otherwise, no spills at 128). Graph µs,
# v_perm 32 x 2 -> 64 x 2 -> 64 x 2 at 128 registers (vperm-b0ecb2c): 64 x 4096 32/8 151.43 -> 174.93 -> 137.90,
# 128 x 2048 32/8 151.98 -> 154.71 -> 141.66, 512 x 1024 12/2 79.78 -> 80.44 -> 74.86, 256 x 256 12/2 12.11 -> 16.16
# -> 12.00, 128 x 1024 12/2 27.69 -> 22.13 -> 22.23; 3 buffers 141.18, 146.09, 77.73, 13.93, 22.44; 128 tokens at 128
# registers 259.42, 210.37, 112.30 (spilled)
FP8_BLOCK_N = 64
FP8_STAGES = 2
FP8_MAXNREG = 128
# the ring's K and V buffers may take this much of sm_90's 227 KB a program: 4 KB stay for the reductions' scratch (2 KB
# in the 128-token, 3-buffer compile) and, with Q_REGS off, q's tile
SMEM_MAX = 227 * 1024 - 4096

if gluon is not None:

    @gluon.constexpr_function
    def _v_perm_layout(block_n, columns_first):
        """V_PERM's [block_n, 128] layouts of an fp8 V step: the B operand's (k_width 4; its token bases 1, 2, 16 and
        32, 64, ... in registers, 4 and 8 in lanes) with the head-dim bits permuted so that a thread's 4 columns are
        adjacent. columns_first False: v_ph, relabelled by V_PERM's reshape / permute into the operand itself;
        True: v_ld, the same elements with those 4 columns in the fastest register bits (one 4-byte shared load)."""
        tokens = [[1, 0], [2, 0], [16, 0]] + [[t, 0] for t in (32, 64, 128) if t < block_n]
        columns = [[0, 1], [0, 2]]
        return gl.DistributedLinearLayout(
            reg_bases=columns + tokens if columns_first else tokens + columns,
            lane_bases=[[4, 0], [8, 0], [0, 4], [0, 8], [0, 16]], warp_bases=[[0, 32], [0, 64]], block_bases=[],
            shape=[block_n, 128])  # fmt: skip

    @gluon.jit
    def _issue(ring, X, pages, tok, end, stride_p, stride_t, offs_d, PAGE_SIZE: gl.constexpr):
        """cp.async copies of one step's rows of X ([BLOCK_N, D]: token tok's row of page `pages`) into a ring
        buffer; rows at or past `end` are zero-filled without a read. 32-bit offsets (``supports``); tok >= 0, so %
        runs unsigned."""
        rows = pages * stride_p + (tok.to(gl.uint32) % PAGE_SIZE).to(gl.int32) * stride_t
        async_copy.async_copy_global_to_shared(ring, X + (rows[:, None] + offs_d[None, :]), mask=(tok < end)[:, None])

    @gluon.jit
    def _decode_single_gluon_kernel(
        Q, K, V, SEQLENS, BLOCK_TABLE, OUT, LSE, O_PART, LSE_PART, qk_scale, K_SCALE, V_SCALE, num_q_heads,
        table_tokens,
        stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_sl,
        stride_btb, stride_btp, stride_ob, stride_oh,
        GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr,
        STAGES: gl.constexpr, SAME_STRIDES: gl.constexpr, WRITE_LSE: gl.constexpr, USE_PDL: gl.constexpr,
        Q_REGS: gl.constexpr = True, DEFER_SUM: gl.constexpr = True, KV_FP8: gl.constexpr = False,
        SCALE_PTR: gl.constexpr = False, V_PERM: gl.constexpr = False, SPLITS: gl.constexpr = 1,
    ):  # fmt: skip
        # layouts: the MMA's accumulator (4 warps along its columns: the tokens of s, the head dim of acc), its A and
        # B operands, q's [16, D] rows and the 16-bit tiles' (8 elements = 16 bytes a thread), the gather's [BLOCK_N, D]
        # rows (16 bytes a thread: 8 elements, 16 of an fp8 cache), the swizzled tiles
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        # an fp8 cache's q . K^T: 4 consecutive head-dim elements a register in both operands (K's bytes read as
        # 32-bit words straight from the 8-bit ring)
        a_op4: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
        b_op4: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
        ldq: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        smem: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        VEC: gl.constexpr = 16 if KV_FP8 else 8
        ld: gl.constexpr = gl.BlockedLayout([1, VEC], [32 * VEC // HEAD_DIM, HEAD_DIM // VEC], [4, 1], [1, 0])
        ring_l: gl.constexpr = gl.SwizzledSharedLayout(vec=VEC, per_phase=1, max_phase=8, order=[1, 0])
        rows_l: gl.constexpr = gl.SliceLayout(1, mma)
        cols_l: gl.constexpr = gl.SliceLayout(0, mma)

        seq = gl.program_id(0)
        kv_head = gl.program_id(1)
        if USE_PDL:
            # chained calls: the previous kernel has finished before the first load
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        end = gl.load(SEQLENS + seq * stride_sl)
        first = 0
        if SPLITS > 1:
            # split program_id(2) of SPLITS walks tokens [first, end): equal chunks of whole steps, the last ones
            # shorter or empty (first past the length: no step, a partial of l = 0 that the merge weighs 0)
            chunk = gl.cdiv(gl.cdiv(end, SPLITS), BLOCK_N) * BLOCK_N
            first = gl.program_id(2) * chunk
            end = gl.minimum(end, first + chunk)
        table_row = BLOCK_TABLE + seq.to(gl.int64) * stride_btb
        K = K + kv_head.to(gl.int64) * stride_kh
        V = V + kv_head.to(gl.int64) * stride_vh

        # q [16, D]: the KV head's GROUP query rows, padding rows 0, converted once to the A operand's registers
        # (Q_REGS False, for measurements: kept in shared memory and read every step, as the tl kernel does)
        offs_h = gl.arange(0, 16, layout=gl.SliceLayout(1, ldq))
        offs_dq = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ldq))
        q_rows = seq.to(gl.int64) * stride_qb + (kv_head * GROUP + offs_h).to(gl.int64) * stride_qh
        q = gl.load(Q + q_rows[:, None] + offs_dq[None, :], mask=(offs_h < GROUP)[:, None], other=0.0)
        if KV_FP8:
            # an fp8 cache's products run in fp16 (as the tl kernel's FP8_DOT_F16): e4m3 / e5m2 values are exact
            # there, q saturates at fp16's largest finite value; k_scale joins the score scale
            q = gl.minimum(gl.maximum(q.to(gl.float32), -65504.0), 65504.0).to(gl.float16)
            if SCALE_PTR:
                qk_scale = qk_scale * gl.load(K_SCALE)
            else:
                qk_scale = qk_scale * K_SCALE
        offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ld))
        if KV_FP8:
            # an fp8 cache's products take q in this form (q_regs does not apply)
            q_a4 = gl.convert_layout(q, a_op4)
        if Q_REGS:
            q_a = gl.convert_layout(q, a_op)
        else:
            q_smem = gl.allocate_shared_memory(q.dtype, [16, HEAD_DIM], smem, q)

        k_ring = gl.allocate_shared_memory(K.dtype.element_ty, [STAGES, BLOCK_N, HEAD_DIM], ring_l)
        v_ring = gl.allocate_shared_memory(V.dtype.element_ty, [STAGES, BLOCK_N, HEAD_DIM], ring_l)
        if KV_FP8 and not V_PERM:
            # the step's V converted to fp16 in registers and staged here for the MMA's operand loads: P . V wants
            # pairs of consecutive tokens, which ldmatrix cannot transpose out of 8-bit rows (the tl kernel's fp8
            # tile reads them a byte at a time)
            v16 = gl.allocate_shared_memory(gl.float16, [BLOCK_N, HEAD_DIM], smem)
        offs_t = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))
        # prologue: steps 0 .. STAGES - 2 in flight (a copy group each, zeros past the end); their page ids masked by
        # the table's width only, so that they load beside the length (ids past the length are never dereferenced)
        for j in gl.static_range(STAGES - 1):
            tok = first + j * BLOCK_N + offs_t
            pages = gl.load(table_row + (tok.to(gl.uint32) // PAGE_SIZE) * stride_btp, mask=tok < table_tokens, other=0)
            _issue(k_ring.index(j), K, pages, tok, end, stride_kp, stride_kt, offs_d, PAGE_SIZE)
            if SAME_STRIDES:
                _issue(v_ring.index(j), V, pages, tok, end, stride_kp, stride_kt, offs_d, PAGE_SIZE)
            else:
                _issue(v_ring.index(j), V, pages, tok, end, stride_vp, stride_vt, offs_d, PAGE_SIZE)
            async_copy.commit_group()
        # the page ids a step ahead of the copies
        tok = first + (STAGES - 1) * BLOCK_N + offs_t
        next_pages = gl.load(table_row + (tok.to(gl.uint32) // PAGE_SIZE) * stride_btp, mask=tok < end, other=0)

        m_i = gl.full([16], float("-inf"), gl.float32, rows_l)  # running max (log2 units)
        l_i = gl.zeros([16], gl.float32, rows_l)  # running sum
        # DEFER_SUM: per-column running sums [16, BLOCK_N], reduced across the warps once after the walk (the row
        # sum per step is a cross-warp reduction: the tl kernel's defer_row_sum)
        l_cols = gl.zeros([16, BLOCK_N], gl.float32, mma)
        acc = gl.zeros([16, HEAD_DIM], gl.float32, mma)  # unnormalised output
        offs_n = gl.arange(0, BLOCK_N, layout=cols_l)
        for i in range(0, gl.cdiv(end - first, BLOCK_N)):
            # step i's group has landed once at most STAGES - 2 are outstanding; the barrier shows every thread's
            # copies to all and frees the buffer that step i - 1 read, which step i + STAGES - 1 now fills
            async_copy.wait_group(STAGES - 2)
            gl.thread_barrier()
            ahead = i + STAGES - 1
            tok = first + ahead * BLOCK_N + offs_t
            _issue(k_ring.index(ahead % STAGES), K, next_pages, tok, end, stride_kp, stride_kt, offs_d, PAGE_SIZE)
            if SAME_STRIDES:
                _issue(v_ring.index(ahead % STAGES), V, next_pages, tok, end, stride_kp, stride_kt, offs_d, PAGE_SIZE)
            else:
                _issue(v_ring.index(ahead % STAGES), V, next_pages, tok, end, stride_vp, stride_vt, offs_d, PAGE_SIZE)
            async_copy.commit_group()
            tok = tok + BLOCK_N
            next_pages = gl.load(table_row + (tok.to(gl.uint32) // PAGE_SIZE) * stride_btp, mask=tok < end, other=0)

            # s [16, BLOCK_N] = q . K^T in log2 units; tokens past the end -inf
            if Q_REGS:
                qa = q_a
            else:
                qa = q_smem.load(a_op)
            if KV_FP8 and V_PERM:
                k_t = k_ring.index(i % STAGES).permute([1, 0]).load(b_op4).to(gl.float16)
            elif KV_FP8:
                # V: 16-byte rows of the 8-bit ring -> fp16 -> the staging tile; K^T: its operand read straight
                # from the ring and converted in registers
                v16.store(v_ring.index(i % STAGES).load(ld).to(gl.float16))
                k_t = k_ring.index(i % STAGES).permute([1, 0]).load(b_op4).to(gl.float16)
                gl.thread_barrier()
            else:
                k_t = k_ring.index(i % STAGES).permute([1, 0]).load(b_op)
            if KV_FP8:
                qa = q_a4
            s = mma_v2(qa, k_t, gl.zeros([16, BLOCK_N], gl.float32, mma)) * qk_scale
            s = gl.where((first + i * BLOCK_N + offs_n < end)[None, :], s, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s - m_new[:, None])
            if DEFER_SUM:
                l_cols = l_cols * alpha[:, None] + p
            else:
                l_i = l_i * alpha + gl.sum(p, axis=1)
            if KV_FP8 and V_PERM:
                # V's operand without the fp16 tile: each thread loads 4 consecutive bytes of 8 token rows (its
                # operand's 4 head-dim columns, made adjacent by a column permutation), transposes them in registers,
                # and the tensor is relabelled (reshape / permute, no data movement) into the operand's layout
                v8 = v_ring.index(i % STAGES).load(_v_perm_layout(BLOCK_N, True))
                v8 = gl.convert_layout(v8, _v_perm_layout(BLOCK_N, False))
                v8 = gl.reshape(gl.permute(gl.reshape(v8, [BLOCK_N, 4, 8, 4]), [0, 3, 1, 2]), [BLOCK_N, HEAD_DIM])
                v = gl.convert_layout(v8, b_op4, assert_trivial=True).to(gl.float16)
                acc = mma_v2(gl.convert_layout(p.to(v.dtype), a_op4), v, acc * alpha[:, None])
            else:
                if KV_FP8:
                    v = v16.load(b_op)
                else:
                    v = v_ring.index(i % STAGES).load(b_op)
                acc = mma_v2(gl.convert_layout(p.to(v.dtype), a_op), v, acc * alpha[:, None])
            m_i = m_new
        async_copy.wait_group(0)
        if USE_PDL:
            # the next call's programs may be scheduled now (they wait for this grid's end before their loads)
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)  # fmt: skip

        if DEFER_SUM:
            l_i = gl.sum(l_cols, axis=1)
        # an empty sequence: out 0, LSE -inf
        empty = l_i == 0.0
        out = acc / gl.where(empty, 1.0, l_i)[:, None]
        if KV_FP8:
            if SCALE_PTR:
                out = out * gl.load(V_SCALE)
            else:
                out = out * V_SCALE
        offs_ho = gl.arange(0, 16, layout=rows_l)
        offs_do = gl.arange(0, HEAD_DIM, layout=cols_l)
        if V_PERM:
            # acc's column n holds head-dim column p(n) of the output: V's operand was relabelled from
            # [D / 32, 8, 4] to [4, D / 32, 8] (n = c * 32 + a * 8 + b for the physical column a * 32 + b * 4 + c)
            offs_do = ((offs_do >> 3) & 3) * 32 + (offs_do & 7) * 4 + (offs_do >> 5)
        heads = kv_head * GROUP + offs_ho
        if SPLITS > 1:
            # the split's partial (fp32, normalised) and its LSE (natural log) at row (seq * SPLITS + split) * Hq +
            # head of triton_splitk's fixed-split workspace, which its combine kernel merges
            lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
            p_rows = (seq * SPLITS + gl.program_id(2)).to(gl.int64) * num_q_heads + heads
            gl.store(O_PART + p_rows[:, None] * HEAD_DIM + offs_do[None, :], out, mask=(offs_ho < GROUP)[:, None])
            gl.store(LSE_PART + p_rows, lse, mask=offs_ho < GROUP)
        else:
            o_rows = seq.to(gl.int64) * stride_ob + heads.to(gl.int64) * stride_oh
            gl.store(OUT + o_rows[:, None] + offs_do[None, :], out.to(OUT.dtype.element_ty),
                     mask=(offs_ho < GROUP)[:, None])  # fmt: skip
            if WRITE_LSE:
                lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
                gl.store(LSE + seq.to(gl.int64) * num_q_heads + heads, lse, mask=offs_ho < GROUP)


def supports(q, k_cache, v_cache, cache_seqlens, block_table, features=None) -> bool:
    """Whether the Gluon kernel computes this call: on a GPU of ``min_capability`` or newer, compiled by a tested
    Triton (TESTED_TRITON), and ``fits``. Host metadata only."""
    if gluon is None or not triton.__version__.startswith(TESTED_TRITON) or q.device.type != "cuda" or interpreting():
        return False
    return _capability_major(q.device.index) >= min_capability(k_cache) and fits(q, k_cache, v_cache, features)


def min_capability(k_cache) -> int:
    """The compute capability (major) the kernel needs for this cache: 8 (mma.sync, cp.async), 9 for fp8 (its
    conversions were compiled and tested on sm_90; newer GPUs are admitted as for 16-bit caches, untested)."""
    return 9 if k_cache.dtype in FP8_DTYPES else 8


def fits(q, k_cache, v_cache, features=None) -> bool:
    """Whether the kernel computes a call of these tensors, on any device (the CPU tests ask it): one query token
    ([B, Hq, D] fp16 / bf16 q), no features but an fp8 cache's scales, a cache of q's dtype or of fp8 (e4m3 / e5m2,
    K's and V's alike), head dim 128, at most MAX_GROUP query heads a KV head, 16-byte aligned rows, offsets within
    32 bits."""
    f = features or PLAIN
    plain = f.softcap is None and f.alibi_slopes is None and f.sinks is None and f.window_left is None
    fp8 = k_cache.dtype in FP8_DTYPES
    if not plain or f.q_len != 1 or bool(f.kv_fp8) != fp8 or q.dim() != 3:
        return False
    # its fp8 products run in fp16 only: triton_common.FP8_DOT_F16 = False (products in q's dtype) keeps the tl kernel
    if fp8 and not triton_common.FP8_DOT_F16:
        return False
    _, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if q.dtype not in (torch.float16, torch.bfloat16) or v_cache.dtype != k_cache.dtype:
        return False
    if not fp8 and k_cache.dtype != q.dtype:
        return False
    if head_dim != HEAD_DIM or num_q_heads // num_kv_heads > MAX_GROUP:
        return False
    # cp.async moves 16 bytes a thread, so the compiler must see every row start 16-byte aligned: the pools 16-byte
    # aligned and their page / token / head strides multiples of 16 elements (what Triton marks as divisible by 16)
    strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or any(s % 16 for s in strides):
        return False
    if not cache_offsets_fit_int32(k_cache, v_cache):
        return False
    return k_cache.data_ptr() % 16 == 0 and v_cache.data_ptr() % 16 == 0


def pays(programs: int, num_sms: int | None, group: int, kv_fp8: bool = False) -> bool:
    """Whether a grid of this many programs, of this many query heads a KV head, on a 16-bit or an fp8 cache, is one
    where the Gluon kernel was measured faster (``GLUON_MIN_PER_SM``, ``GLUON_FP8_MIN_PER_SM``)."""
    low, high = (GLUON_FP8_MIN_PER_SM, GLUON_FP8_MAX_PER_SM) if kv_fp8 else (GLUON_MIN_PER_SM, GLUON_MAX_PER_SM)
    if not GLUON_MIN_PER_SM or not low or not num_sms or group < (GLUON_FP8_MIN_GROUP if kv_fp8 else GLUON_MIN_GROUP):
        return False
    return low * num_sms <= programs <= high * num_sms


def decode_single_gluon(
    q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, out, lse=None, stages=None, block_n=None,
    q_regs=True, defer_sum=True, k_scale=1.0, v_scale=1.0, v_perm=None, maxnreg=None, splits=1,
):  # fmt: skip
    """Launch the Gluon single pass (``supports`` must hold), or with splits > 1 flash-decoding on it.

    Args:
        q: [B, Hq, 128] fp16/bf16. k_cache, v_cache: [num_pages, page_size, Hkv, 128] of q's dtype, or both of
            one fp8 dtype (e4m3 / e5m2).
        cache_seqlens: [B] int32. block_table: [B, max_pages] int32. softmax_scale: float.
        out: [B, Hq, 128], written in place. lse: None or contiguous fp32 [B, Hq] (natural log).
        stages: ring buffers (2 or more). block_n: tokens a step (a power of two, 16 or more). None: STAGES x
            BLOCK_N for a 16-bit cache, FP8_STAGES x FP8_BLOCK_N for fp8.
        q_regs: False reads q from shared memory every step, as the tl kernel does (for measurements; a 16-bit cache).
        defer_sum: the row sums reduced across the warps once after the walk (False: every step). H200, graph µs,
            every step -> once (h200-2026-11-30/gluon-gate-73b4c45, one process): 256 x 256 12/2 19.11 -> 18.84,
            512 x 256 12/2 36.28 -> 35.87, 64 x 4096 32/8 243.24 -> 242.82, 128 x 1024 12/2 37.20 -> 36.74.
        k_scale, v_scale: an fp8 cache's dequantisation scales (k = k_scale * k_fp8), Python floats or 0-d /
            1-element fp32 device tensors (both of one kind); unused for a 16-bit cache.
        v_perm: an fp8 cache's V operand by 4-byte shared loads and a transpose in registers (steps of 32 tokens
            or more) instead of staging V as fp16 for ``ldmatrix`` (False); None: for fp8 steps of 32-128. V then
            costs 2 shared-memory bytes a cache byte instead of 4, for 283 loop instructions a 32-token step against
            211; H200, e4m3, graph µs, staged -> v_perm, 32 x 2 (h200-2026-11-30/vperm-6359d12, one process):
            64 x 4096 32/8 158.09 -> 148.07, 128 x 2048 32/8 156.32 -> 147.14, 512 x 1024 12/2 81.40 -> 75.74,
            192 x 1024 12/2 34.36 -> 32.58, 256 x 256 12/2 13.11 -> 12.28.
        maxnreg: a cap on the registers a thread, 128 letting 4 programs share a SM; 0: the compiler's choice;
            None: FP8_MAXNREG for fp8 steps of up to FP8_BLOCK_N tokens, else 0.
        splits: S > 1 programs a sequence and KV head, each over an equal chunk of whole steps, writing fp32
            partials and their LSEs into triton_splitk's fixed-split workspace ([B * S, Hq, 128], [B * S, Hq]);
            ``triton_splitk.launch_combine`` then merges them into out / lse (a second launch, PDL-chained).
            ``plan_decode`` takes it for an fp8 cache's even split batches (``plan.GLUON_FP8_SPLITS``). H200, e4m3,
            graph µs, the plan's tl splits -> this (h200-2026-11-30/gsplit-6b09e9b): 1 x 131072 32/8 81.39 -> 67.67
            (S 64), 1 x 65536 12/2 17.66 -> 14.59 (S 256), 4 x 16384 12/2 16.62 -> 14.06 (S 64).
    """
    batch, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    assert head_dim == HEAD_DIM and num_q_heads // num_kv_heads <= MAX_GROUP, "see supports()"
    assert lse is None or lse.is_contiguous(), "lse workspace must be contiguous [B, Hq]"
    fp8 = k_cache.dtype in FP8_DTYPES
    stages = (FP8_STAGES if fp8 else STAGES) if stages is None else stages
    block_n = (FP8_BLOCK_N if fp8 else BLOCK_N) if block_n is None else block_n
    # the cap where it was measured (longer fp8 steps spill under it)
    maxnreg = (FP8_MAXNREG if fp8 and block_n <= FP8_BLOCK_N else 0) if maxnreg is None else maxnreg
    assert stages >= 2, f"stages {stages}: the ring needs a buffer to read and one to fill"
    assert block_n >= 16 and block_n & (block_n - 1) == 0, f"block_n {block_n}: a power of two >= 16"
    v_perm = fp8 and 32 <= block_n <= 128 if v_perm is None else v_perm
    ok = not v_perm or (fp8 and 32 <= block_n <= 128)
    assert ok, f"v_perm: fp8, 32-128 tokens a step, not {k_cache.dtype} x {block_n}"
    assert v_cache.dtype == k_cache.dtype, f"k_cache {k_cache.dtype} and v_cache {v_cache.dtype}: one dtype"
    # the ring, and an fp8 cache's fp16 staging tile for V
    ring_bytes = 2 * stages * block_n * head_dim * k_cache.element_size()
    ring_bytes += block_n * head_dim * 2 if fp8 and not v_perm else 0
    assert ring_bytes <= SMEM_MAX, f"stages {stages} x block_n {block_n}: a {ring_bytes}-byte ring, over {SMEM_MAX}"
    stride_kp, stride_kt, stride_kh, _ = k_cache.stride()
    stride_vp, stride_vt, stride_vh, _ = v_cache.stride()
    chain = chain_pdl(q.device) and use_pdl(q.device)
    scale_ptr = isinstance(k_scale, torch.Tensor)
    assert scale_ptr == isinstance(v_scale, torch.Tensor), "k_scale and v_scale: both floats or both device tensors"
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)) if scale_ptr else ():
        ok = t.dtype == torch.float32 and t.numel() == 1 and t.device == q.device
        assert ok, f"{name}: a 1-element fp32 tensor on {q.device}, not {t.dtype} {tuple(t.shape)} on {t.device}"
    assert splits >= 1, f"splits {splits}: 1 or more"
    if splits > 1:
        o_part = workspace((batch * splits, num_q_heads, head_dim), torch.float32, q.device)
        lse_part = workspace((batch * splits, num_q_heads), torch.float32, q.device)
    else:
        o_part = lse_part = out  # read by no program
    launch(
        _decode_single_gluon_kernel, (batch, num_kv_heads, splits),
        q, k_cache, v_cache, cache_seqlens, block_table, out, lse if lse is not None else out, o_part, lse_part,
        qk_scale=softmax_scale * LOG2E, K_SCALE=k_scale if scale_ptr else float(k_scale),
        V_SCALE=v_scale if scale_ptr else float(v_scale), num_q_heads=num_q_heads,
        table_tokens=block_table.shape[1] * page_size,
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_kp=stride_kp, stride_kt=stride_kt, stride_kh=stride_kh,
        stride_vp=stride_vp, stride_vt=stride_vt, stride_vh=stride_vh, stride_sl=cache_seqlens.stride(0),
        stride_btb=block_table.stride(0), stride_btp=block_table.stride(1), stride_ob=out.stride(0),
        stride_oh=out.stride(1),
        GROUP=num_q_heads // num_kv_heads, HEAD_DIM=head_dim, PAGE_SIZE=page_size, BLOCK_N=block_n, STAGES=stages,
        SAME_STRIDES=(stride_kp, stride_kt) == (stride_vp, stride_vt), WRITE_LSE=lse is not None, USE_PDL=chain,
        Q_REGS=bool(q_regs), DEFER_SUM=bool(defer_sum), KV_FP8=fp8, SCALE_PTR=scale_ptr, V_PERM=bool(v_perm),
        SPLITS=splits,
        num_warps=4, **({"maxnreg": maxnreg} if maxnreg else {}),
        **({"launch_pdl": True} if chain else {}),
    )  # fmt: skip
    if splits > 1:
        from .triton_splitk import launch_combine  # triton_splitk imports triton_single, which imports this module

        # fixed mode reads no plan; the combine waits for the partials under PDL
        plan = workspace((1,), torch.int32, q.device)
        launch_combine(o_part, lse_part, out, lse, plan, batch * splits, splits, pdl=use_pdl(q.device),
                       num_sms=torch.cuda.get_device_properties(q.device).multi_processor_count)  # fmt: skip
    return out, lse
