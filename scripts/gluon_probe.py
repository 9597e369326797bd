"""Does the single pass gain from holding q in registers? A Gluon (Triton's explicit-layout dialect) copy of the
12/2 single pass with the layouts written out, timed beside the library (probe, not in the library).

The library's `tl` kernel re-reads its 16 x 128 q tile from shared memory at every step (8 of the loop's 18
`LDSM`, docs/design.md "Masks and clamped tokens"): Triton keeps that MMA operand in shared memory. Here q is
converted once to the MMA's A-operand layout and stays in registers (Q_REGS 1), or is read from shared memory at
each step as Triton does (Q_REGS 0), with everything else alike: a program per (sequence, KV head), 4 warps over
the tokens of q . K^T and the head dim of P . V, 32-token steps, the K and V tiles gathered through the block table
by async copies into a ring of STAGES buffers (STAGES - 1 steps in flight), the page ids a step ahead, the online softmax in
exp2, the first page ids loaded beside the length and calls chained by PDL as the library's are. One query token,
16-bit cache, head_dim 128, group <= 16, page size dividing 32. A step past a sequence's end is masked: its copies
write zeros (cp.async with a source size of 0, in the PTX) and its scores are -inf; the ragged rows below check it
with the slots past each length poisoned with NaN. At 69ebf3b (no PDL, ids after the length, 3 and 4 buffers) q in
registers took 256 x 256 12/2 20.89 -> 20.30 us, 512 x 512 12/2 68.49 -> 67.33, against the library's 19.47 and
69.29 (h200-2026-11-30/gluon-69ebf3b). As it is now, with 2 buffers and q in registers: 256 x 256 12/2 18.62-18.83 us
against the library's 19.44-19.75 in five processes (gluon-6a9ffcd, gluon-26bab2b, gluon-ddfb875, gluon-73d600e;
docs/design.md, "A Gluon single pass: under 19 µs").

    python scripts/gluon_probe.py [--rows B,L,Hq,Hkv[;...]]   # on the GPU; writes $OUT/gluon.jsonl, a table last
"""

import argparse
import itertools
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from flashdecode import decode_attention, plan_decode
from flashdecode.bench import ProbeLog, probe_case, probe_graph_us
from flashdecode.cases import poison_page_tails


@gluon.jit
def _issue(k_buf, v_buf, K, V, pages, tok, end, stride_kp, stride_kt, PAGE_SIZE: gl.constexpr, offs_d):
    """Async copies of one step's K and V rows ([BLOCK_N, D], gathered through `pages`) into a ring buffer."""
    # 32-bit offsets (gluon_decode checks the pool fits), tokens >= 0 so % runs unsigned
    rows = pages * stride_kp + (tok.to(gl.uint32) % PAGE_SIZE).to(gl.int32) * stride_kt
    offs = rows[:, None] + offs_d[None, :]
    mask = (tok < end)[:, None]
    async_copy.async_copy_global_to_shared(k_buf, K + offs, mask=mask)
    async_copy.async_copy_global_to_shared(v_buf, V + offs, mask=mask)


@gluon.jit
def _gluon_decode_kernel(
    Q, K, V, TABLE, LENS, OUT, qk_scale, stride_kp, stride_kt, stride_kh, stride_bt, table_tokens,
    HQ: gl.constexpr, GROUP: gl.constexpr, PAGE_SIZE: gl.constexpr, D: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, Q_REGS: gl.constexpr,
):  # fmt: skip
    # layouts: the MMA's accumulator (4 warps along the columns: tokens of s, head dim of acc), its operands, the
    # gather's [BLOCK_N, D] tile (8 elements = 16 bytes a thread), the ring's swizzled shared tiles
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    smem: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma)

    b = gl.program_id(0)
    h = gl.program_id(1)
    # PDL, as the library's calls chain: the previous call has finished before the first load
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    end = gl.load(LENS + b)
    row_ptr = TABLE + b.to(gl.int64) * stride_bt
    K = K + h.to(gl.int64) * stride_kh
    V = V + h.to(gl.int64) * stride_kh

    # q [16, D]: rows h * GROUP + [0, GROUP) of sequence b, padding rows 0
    offs_h = gl.arange(0, 16, layout=gl.SliceLayout(1, ld))
    offs_dq = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    q_rows = b.to(gl.int64) * HQ + h * GROUP + offs_h
    q = gl.load(Q + q_rows[:, None] * D + offs_dq[None, :], mask=(offs_h < GROUP)[:, None], other=0.0)
    if Q_REGS:
        q_a = gl.convert_layout(q, a_op)
    else:
        q_smem = gl.allocate_shared_memory(Q.dtype.element_ty, [16, D], smem, q)

    k_ring = gl.allocate_shared_memory(K.dtype.element_ty, [STAGES, BLOCK_N, D], smem)
    v_ring = gl.allocate_shared_memory(V.dtype.element_ty, [STAGES, BLOCK_N, D], smem)
    offs_t = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    # prologue: steps 0 .. STAGES - 2 in flight (a group each, empty past the end), then the page ids a step ahead;
    # the prologue's page ids masked by the table's width, so that they load beside the length (the library's
    # EARLY_PAGES: ids past the length are read but never dereferenced)
    for j in gl.static_range(STAGES - 1):
        tok = j * BLOCK_N + offs_t
        pages = gl.load(row_ptr + tok.to(gl.uint32) // PAGE_SIZE, mask=tok < table_tokens, other=0)
        _issue(k_ring.index(j), v_ring.index(j), K, V, pages, tok, end, stride_kp, stride_kt, PAGE_SIZE, offs_d)
        async_copy.commit_group()
    tok = (STAGES - 1) * BLOCK_N + offs_t
    next_pages = gl.load(row_ptr + tok.to(gl.uint32) // PAGE_SIZE, mask=tok < end, other=0)

    m_i = gl.full([16], float("-inf"), gl.float32, rows_l)
    l_i = gl.zeros([16], gl.float32, rows_l)
    acc = gl.zeros([16, D], gl.float32, mma)
    offs_n0 = gl.arange(0, BLOCK_N, layout=cols_l)
    n_steps = gl.cdiv(end, BLOCK_N)
    for i in range(0, n_steps):
        # step i's group is done once at most STAGES - 2 are outstanding; the barrier makes every thread's copies
        # visible and frees the buffer step i - 1 read, which step i + STAGES - 1 fills
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()
        ahead = i + STAGES - 1
        tok = ahead * BLOCK_N + offs_t
        slot_w = ahead % STAGES
        _issue(k_ring.index(slot_w), v_ring.index(slot_w), K, V, next_pages, tok, end, stride_kp, stride_kt,
               PAGE_SIZE, offs_d)  # fmt: skip
        async_copy.commit_group()
        tok = tok + BLOCK_N
        next_pages = gl.load(row_ptr + tok.to(gl.uint32) // PAGE_SIZE, mask=tok < end, other=0)

        slot = i % STAGES
        if Q_REGS:
            qa = q_a
        else:
            qa = q_smem.load(a_op)
        k_t = k_ring.index(slot).permute([1, 0]).load(b_op)
        s = mma_v2(qa, k_t, gl.zeros([16, BLOCK_N], gl.float32, mma)) * qk_scale
        s = gl.where((i * BLOCK_N + offs_n0 < end)[None, :], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        v = v_ring.index(slot).load(b_op)
        acc = mma_v2(gl.convert_layout(p.to(V.dtype.element_ty), a_op), v, acc * alpha[:, None])
        m_i = m_new
    async_copy.wait_group(0)
    # the next call may be scheduled now (it waits for this one's end before its loads)
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)  # fmt: skip

    out = acc / gl.where(l_i > 0.0, l_i, 1.0)[:, None]
    offs_ho = gl.arange(0, 16, layout=rows_l)
    offs_do = gl.arange(0, D, layout=cols_l)
    o_rows = b.to(gl.int64) * HQ + h * GROUP + offs_ho
    gl.store(OUT + o_rows[:, None] * D + offs_do[None, :], out.to(OUT.dtype.element_ty),
             mask=(offs_ho < GROUP)[:, None])  # fmt: skip


def gluon_decode(case, out, q_regs=True, block_n=32, stages=3):
    """The probe kernel over a paged case (one query token): writes out [B, Hq, D]."""
    batch, hq, d = case.q.shape
    _, page_size, hkv, _ = case.k_cache.shape
    assert case.k_cache.stride() == case.v_cache.stride() and d == 128 and block_n % page_size == 0
    assert case.k_cache.numel() < 2**31, "32-bit offsets"
    kp, kt, kh, _ = case.k_cache.stride()
    _gluon_decode_kernel[(batch, hkv)](
        case.q, case.k_cache, case.v_cache, case.block_table, case.cache_seqlens, out, d**-0.5 * math.log2(math.e),
        kp, kt, kh, case.block_table.stride(0), case.block_table.shape[1] * page_size,
        HQ=hq, GROUP=hq // hkv, PAGE_SIZE=page_size, D=d, BLOCK_N=block_n, STAGES=stages, Q_REGS=int(q_regs),
        num_warps=4, launch_pdl=True,
    )  # fmt: skip


RAGGED = [0, 1, 17, 31, 33, 100, 255, 513] * 32
ROWS = [([256] * 256, 12, 2), ([512] * 128, 12, 2), ([512] * 512, 12, 2), ([2048] * 32, 28, 4), (RAGGED, 12, 2),
        (RAGGED, 28, 4)]  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="", help="B,L,Hq,Hkv;... (uniform rows) instead of ROWS")
    args = ap.parse_args()
    rows = ROWS
    if args.rows:
        rows = [([ln] * b, hq, hkv) for b, ln, hq, hkv in (map(int, r.split(",")) for r in args.rows.split(";"))]
    log = ProbeLog("gluon")
    for seqlens, hq, hkv in rows:
        case, ref, copies = probe_case(seqlens, hq, hkv)
        for c in copies:
            poison_page_tails(c)
        name = f"{len(seqlens)}x{seqlens[0]} {hq}/{hkv}" if len(set(seqlens)) == 1 else f"ragged {hq}/{hkv}"
        out = torch.empty_like(case.q)
        res = {}
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        variants = {"library (plan)": lambda c: decode_attention(*c.args, out=out, plan=plan)}
        for q_regs, stages in ((True, 2), (True, 3), (False, 2), (False, 3)):
            variants[f"gluon q {'regs' if q_regs else 'smem'} s{stages}"] = (
                lambda c, q_regs=q_regs, stages=stages: gluon_decode(c, out, q_regs, stages=stages))
        for key, fn in variants.items():
            out.fill_(float("nan"))
            fn(case)
            err = (out.double() - ref).abs().max().item()
            it = itertools.cycle(copies)
            us = probe_graph_us(lambda: fn(next(it))) if err < 2e-2 else None
            res[key] = us
            log.record(dict(row=name, variant=key, us=us, err=err))
            log.line(f"{name:<14} {key:<22} " + (f"{us:7.2f} us" if us else f"wrong: error {err:.3g}")
                     + f"  (error {err:.2e})")  # fmt: skip
    log.close()


if __name__ == "__main__":
    main()
