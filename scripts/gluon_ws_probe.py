"""One program a (sequence, KV head) that walks its tokens as four independent streams: a probe for the one-wave
rows (64 x 1024 12/2), where four programs a SM (the chunk pass of scripts/gluon_split_probe.py: 19.0 µs) beat one
(the tl single pass: 19.5-19.8) but need a merge through global memory (1.8 µs and more, gluon-split-c4f2a67).

Here the four streams are the four warp-specialized partitions of one CTA (``gl.warp_specialize``, 4 warps each):
each walks a quarter of the sequence with its own ring, exactly as ``gluon_single``'s loop, and the three worker
partitions hand their (max, sum, acc) to the default one through shared memory and an mbarrier; the default
partition merges the four and writes the output. Checked against float64 before timing.

    python scripts/gluon_ws_probe.py [--rows B,L,Hq,Hkv;...]    # on the GPU; $OUT/gluon_ws.jsonl, a table last
"""

import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from flashdecode import decode_attention, gluon_single, plan_decode
from flashdecode.bench import ProbeLog, probe_case, probe_rows, probe_variants
from flashdecode.gluon_single import _issue
from flashdecode.triton_common import LN2, LOG2E
from flashdecode.triton_single import decode_single

ROWS = [(64, 1024, 12, 2), (16, 1024, 32, 8), (32, 512, 28, 4), (128, 1024, 12, 2), (256, 256, 12, 2)]
PARTS = gl.constexpr(4)


@gluon.jit
def _walk(Q, K, V, table_row, q_row, first, end, table_tokens, k_ring, v_ring, qk_scale, stride_qh, stride_kp,
          stride_kt, stride_btp, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr,
          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, RING0: gl.constexpr):  # fmt: skip
    """gluon_single's walk over tokens [first, end) (K and V of one stride set): (m [16] log2, l [16], acc
    [16, D] unnormalised), in the accumulator layout of 4 warps; its ring is buffers RING0 .. RING0 + STAGES - 1."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    offs_h = gl.arange(0, 16, layout=gl.SliceLayout(1, ld))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ld))
    q = gl.load(Q + q_row + offs_h[:, None].to(gl.int64) * stride_qh + offs_d[None, :], mask=(offs_h < GROUP)[:, None],
                other=0.0)  # fmt: skip
    q_a = gl.convert_layout(q, a_op)
    offs_t = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))
    for j in gl.static_range(STAGES - 1):
        tok = first + j * BLOCK_N + offs_t
        pages = gl.load(table_row + (tok.to(gl.uint32) // PAGE_SIZE) * stride_btp, mask=tok < table_tokens, other=0)
        _issue(k_ring.index(RING0 + j), K, pages, tok, end, stride_kp, stride_kt, offs_d, PAGE_SIZE)
        _issue(v_ring.index(RING0 + j), V, pages, tok, end, stride_kp, stride_kt, offs_d, PAGE_SIZE)
        async_copy.commit_group()
    tok = first + (STAGES - 1) * BLOCK_N + offs_t
    next_pages = gl.load(table_row + (tok.to(gl.uint32) // PAGE_SIZE) * stride_btp, mask=tok < end, other=0)
    m_i = gl.full([16], float("-inf"), gl.float32, gl.SliceLayout(1, mma))
    l_cols = gl.zeros([16, BLOCK_N], gl.float32, mma)
    acc = gl.zeros([16, HEAD_DIM], gl.float32, mma)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    for i in range(0, gl.cdiv(end - first, BLOCK_N)):
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()
        ahead = i + STAGES - 1
        tok = first + ahead * BLOCK_N + offs_t
        _issue(k_ring.index(RING0 + ahead % STAGES), K, next_pages, tok, end, stride_kp, stride_kt, offs_d, PAGE_SIZE)
        _issue(v_ring.index(RING0 + ahead % STAGES), V, next_pages, tok, end, stride_kp, stride_kt, offs_d, PAGE_SIZE)
        async_copy.commit_group()
        tok = tok + BLOCK_N
        next_pages = gl.load(table_row + (tok.to(gl.uint32) // PAGE_SIZE) * stride_btp, mask=tok < end, other=0)
        k_t = k_ring.index(RING0 + i % STAGES).permute([1, 0]).load(b_op)
        s = mma_v2(q_a, k_t, gl.zeros([16, BLOCK_N], gl.float32, mma)) * qk_scale
        s = gl.where((first + i * BLOCK_N + offs_n < end)[None, :], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_cols = l_cols * alpha[:, None] + p
        v = v_ring.index(RING0 + i % STAGES).load(b_op)
        acc = mma_v2(gl.convert_layout(p.to(V.dtype.element_ty), a_op), v, acc * alpha[:, None])
        m_i = m_new
    async_copy.wait_group(0)
    return m_i, gl.sum(l_cols, axis=1), acc


@gluon.jit
def _worker(Q, K, V, table_row, q_row, length, table_tokens, k_rings, v_rings, st_m, st_l, st_acc, bar, qk_scale,
            stride_qh, stride_kp, stride_kt, stride_btp, PART: gl.constexpr, GROUP: gl.constexpr,
            HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """Partition PART (1-3): its quarter of the tokens, its state to shared memory slot PART - 1, one arrival."""
    chunk = gl.cdiv(gl.cdiv(length, 4), BLOCK_N) * BLOCK_N
    first = PART * chunk
    end = gl.minimum(length, first + chunk)
    m_i, l_i, acc = _walk(Q, K, V, table_row, q_row, first, end, table_tokens, k_rings, v_rings, qk_scale,
                          stride_qh, stride_kp, stride_kt, stride_btp, GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_N, STAGES,
                          PART * STAGES)  # fmt: skip
    st_m.index(PART - 1).store(m_i)
    st_l.index(PART - 1).store(l_i)
    st_acc.index(PART - 1).store(acc)
    gl.thread_barrier()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _default(Q, K, V, OUT, LSE, table_row, q_row, seq, kv_head, length, table_tokens, k_rings, v_rings, st_m, st_l,
             st_acc, bar, qk_scale, num_q_heads, stride_qh, stride_kp, stride_kt, stride_btp, stride_ob, stride_oh,
             GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr, USE_PDL: gl.constexpr):  # fmt: skip
    """Partition 0: the first quarter, then the merge of the four states (log2 units) and the output."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma)
    chunk = gl.cdiv(gl.cdiv(length, 4), BLOCK_N) * BLOCK_N
    m_i, l_i, acc = _walk(Q, K, V, table_row, q_row, 0, gl.minimum(length, chunk), table_tokens, k_rings, v_rings,
                          qk_scale, stride_qh, stride_kp, stride_kt, stride_btp, GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_N,
                          STAGES, 0)  # fmt: skip
    if USE_PDL:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)  # fmt: skip
    mbarrier.wait(bar, 0)
    m_all = m_i
    for p in gl.static_range(PARTS - 1):
        m_all = gl.maximum(m_all, st_m.index(p).load(rows_l))
    m_ref = gl.where(m_all == float("-inf"), 0.0, m_all)
    f = gl.exp2(m_i - m_ref)
    l_sum = l_i * f
    acc = acc * f[:, None]
    for p in gl.static_range(PARTS - 1):
        f = gl.exp2(st_m.index(p).load(rows_l) - m_ref)
        l_sum += st_l.index(p).load(rows_l) * f
        acc += st_acc.index(p).load(mma) * f[:, None]
    empty = l_sum == 0.0
    out = acc / gl.where(empty, 1.0, l_sum)[:, None]
    offs_ho = gl.arange(0, 16, layout=rows_l)
    offs_do = gl.arange(0, HEAD_DIM, layout=cols_l)
    heads = kv_head * GROUP + offs_ho
    o_rows = seq.to(gl.int64) * stride_ob + heads.to(gl.int64) * stride_oh
    gl.store(OUT + o_rows[:, None] + offs_do[None, :], out.to(OUT.dtype.element_ty), mask=(offs_ho < GROUP)[:, None])
    lse = gl.where(empty, float("-inf"), (m_all + gl.log2(gl.where(empty, 1.0, l_sum))) * LN2)
    gl.store(LSE + seq.to(gl.int64) * num_q_heads + heads, lse, mask=offs_ho < GROUP)


@gluon.jit
def _ws_kernel(Q, K, V, SEQLENS, BLOCK_TABLE, OUT, LSE, qk_scale, num_q_heads, table_tokens, stride_qb, stride_qh,
               stride_kp, stride_kt, stride_kh, stride_btb, stride_btp, stride_ob, stride_oh, GROUP: gl.constexpr,
               HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
               USE_PDL: gl.constexpr, WORKER_REGS: gl.constexpr):  # fmt: skip
    # shared layouts name the order of a buffer's 2-D (or 1-D) slices: the leading dim indexes the buffers
    smem: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    flat1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    flat2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    seq = gl.program_id(0)
    kv_head = gl.program_id(1)
    if USE_PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    length = gl.load(SEQLENS + seq)
    table_row = BLOCK_TABLE + seq.to(gl.int64) * stride_btb
    K = K + kv_head.to(gl.int64) * stride_kh
    V = V + kv_head.to(gl.int64) * stride_kh
    q_row = seq.to(gl.int64) * stride_qb + (kv_head * GROUP).to(gl.int64) * stride_qh
    # a ring a partition: partition p's buffers p * STAGES .. p * STAGES + STAGES - 1
    k_r = gl.allocate_shared_memory(K.dtype.element_ty, [PARTS * STAGES, BLOCK_N, HEAD_DIM], smem)
    v_r = gl.allocate_shared_memory(V.dtype.element_ty, [PARTS * STAGES, BLOCK_N, HEAD_DIM], smem)
    st_m = gl.allocate_shared_memory(gl.float32, [PARTS - 1, 16], flat1)
    st_l = gl.allocate_shared_memory(gl.float32, [PARTS - 1, 16], flat1)
    st_acc = gl.allocate_shared_memory(gl.float32, [PARTS - 1, 16, HEAD_DIM], flat2)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=PARTS - 1)
    gl.warp_specialize(
        [
            (_default, (Q, K, V, OUT, LSE, table_row, q_row, seq, kv_head, length, table_tokens, k_r, v_r, st_m, st_l,
                        st_acc, bar, qk_scale, num_q_heads, stride_qh, stride_kp, stride_kt, stride_btp, stride_ob,
                        stride_oh, GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_N, STAGES, USE_PDL)),
            (_worker, (Q, K, V, table_row, q_row, length, table_tokens, k_r, v_r, st_m, st_l, st_acc, bar, qk_scale,
                       stride_qh, stride_kp, stride_kt, stride_btp, 1, GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_N, STAGES)),
            (_worker, (Q, K, V, table_row, q_row, length, table_tokens, k_r, v_r, st_m, st_l, st_acc, bar, qk_scale,
                       stride_qh, stride_kp, stride_kt, stride_btp, 2, GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_N, STAGES)),
            (_worker, (Q, K, V, table_row, q_row, length, table_tokens, k_r, v_r, st_m, st_l, st_acc, bar, qk_scale,
                       stride_qh, stride_kp, stride_kt, stride_btp, 3, GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_N, STAGES)),
        ],
        [4, 4, 4], [WORKER_REGS, WORKER_REGS, WORKER_REGS],
    )  # fmt: skip


def decode_ws(q, k_cache, v_cache, seqlens, table, scale, out, lse, stages=2, block_n=32, worker_regs=128):
    batch, hq, d = q.shape
    _, page, hkv, _ = k_cache.shape
    assert k_cache.stride() == v_cache.stride()
    from flashdecode.triton_common import chain_pdl, use_pdl

    chain = chain_pdl(q.device) and use_pdl(q.device)
    _ws_kernel[(batch, hkv)](
        q, k_cache, v_cache, seqlens, table, out, lse, scale * LOG2E, hq, table.shape[1] * page, q.stride(0),
        q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), table.stride(0), table.stride(1),
        out.stride(0), out.stride(1), GROUP=hq // hkv, HEAD_DIM=d, PAGE_SIZE=page, BLOCK_N=block_n, STAGES=stages,
        USE_PDL=chain, WORKER_REGS=worker_regs, num_warps=4, maxnreg=128, **({"launch_pdl": True} if chain else {}),
    )  # fmt: skip
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="", help="B,L,Hq,Hkv;... instead of ROWS")
    ap.add_argument("--variants", default="ws32x2,ws16x3,ws16x4",
                    help="wsNxS: N tokens a step, S buffers a stream (64 x 2 and 32 x 3 overflow shared memory)")
    args = ap.parse_args()
    rows = probe_rows(args.rows, ROWS)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    log = ProbeLog("gluon_ws")
    for batch, length, hq, hkv in rows:
        case, ref, copies = probe_case([length] * batch, hq, hkv)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        scale = case.q.shape[-1] ** -0.5
        out = torch.empty_like(case.q)
        lse = torch.empty(case.q.shape[:2], dtype=torch.float32, device="cuda")
        variants = {
            "plan": lambda c: decode_attention(*c.args, out=out, plan=plan),
            "tl": lambda c: decode_single(*c.args, scale, out, num_sms=sms, gluon=False),
            "g32x2d": lambda c: gluon_single.decode_single_gluon(*c.args, scale, out),
        }
        for v in args.variants.split(","):
            n, s = map(int, v[2:].split("x"))
            variants[v] = lambda c, n=n, s=s: decode_ws(*c.args, scale, out, lse, stages=s, block_n=n)
        errs, times = probe_variants(variants, case, ref, copies, out)
        name = f"{batch}x{length} {hq}/{hkv}"
        log.row(
            dict(row=name, programs_per_sm=batch * hkv / sms, errs=errs, us=times),
            f"{name:<16} {batch * hkv / sms:5.2f}/SM "
            + "  ".join(f"{k} {min(v):7.2f}" + ("" if errs[k] < 2e-2 else " ERR") for k, v in times.items()),
        )  # fmt: skip
    log.close()


if __name__ == "__main__":
    main()
