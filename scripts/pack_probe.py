"""Both KV heads of a 12/2 token row in one program: does a 512-byte token row read whole, with a block-diagonal query
tile, make the single pass of the 67 MB 12/2 rows faster than one program per KV head?

    python scripts/pack_probe.py            (GPU: writes $OUT/pack.jsonl, prints a table last)
    TRITON_INTERPRET=1 python scripts/pack_probe.py check      (CPU: the kernel against the float64 reference)

A probe kernel, one program per (sequence, block of HEADS KV heads), the whole sequence in one walk (a single pass).
With HEADS = 2 the query tile Q' [16, 2 * D] is block diagonal: query row r (of KV head r // GROUP) holds its q in
columns [(r // GROUP) * D, +D) and zeros elsewhere, and the K and V tiles [BLOCK_N, 2 * D] are the two heads' token
rows side by side (contiguous in an NHD cache). Then S = Q' K'^T gives each row its own head's scores, P V' its own
head's output in its own columns: twice the products' arithmetic (free here), half the programs, 12 of the tile's 16
rows used instead of 6, and the online softmax's per-tile work spread over twice the bytes. HEADS = 1 is the same
kernel one KV head a program (the control). Modes: ``decode`` (the online softmax), ``dots`` (the two products without
it) and ``read`` (the loads summed).
"""

import itertools
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "src")
from flashdecode import decode_attention, plan_decode  # noqa: E402
from flashdecode.bench import ProbeLog, Row, probe_case, probe_graph_us  # noqa: E402
from flashdecode.check import max_err  # noqa: E402
from flashdecode.triton_common import LOG2E  # noqa: E402

ROWS = [Row([256] * 256, 12, 2), Row([1024] * 64, 12, 2), Row([4096] * 16, 12, 2)]
MODES = {"decode": 0, "dots": 1, "read": 2}
# (HEADS, BLOCK_N, stages): a 32-token tile of two heads holds 32 KB a stage (2 programs a SM at 3 stages), one head
# 16 KB (4 a SM); 128 tokens of one head at 3 stages is the library's one-wave tile (one a SM)
VARIANTS = [(1, 32, 3), (1, 64, 3), (1, 128, 3), (2, 32, 3), (2, 32, 4), (2, 64, 3)]


@triton.jit
def _pack_kernel(
    Q, K, V, SEQLENS, TABLE, OUT, SINK, qk_scale, stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_bt,
    HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, DOT_F32: tl.constexpr,
):  # fmt: skip
    W: tl.constexpr = HEADS * HEAD_DIM
    b = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    offs_h = tl.arange(0, BLOCK_H)
    offs_w = tl.arange(0, W)
    # [BLOCK_H, W]: which columns of the packed tile are row r's own head's, and where they are in its q / out row
    kv_of_row = offs_h // GROUP
    mine = (offs_h < HEADS * GROUP)[:, None] & ((offs_w // HEAD_DIM)[None, :] == kv_of_row[:, None])
    col = offs_w[None, :] - (kv_of_row * HEAD_DIM)[:, None]
    q_rows = (hb * HEADS * GROUP + offs_h).to(tl.int64)
    q = tl.load(Q + b * stride_qb + q_rows[:, None] * stride_qh + col, mask=mine, other=0.0)  # [BLOCK_H, W]
    if DOT_F32:  # the interpreter's bf16 tl.dot is wrong
        q = q.to(tl.float32)
    seqlen = tl.load(SEQLENS + b)
    k0 = K + (hb * HEADS).to(tl.int64) * stride_kh
    v0 = V + (hb * HEADS).to(tl.int64) * stride_kh
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, W], tl.float32)
    total = tl.zeros([BLOCK_N, W], tl.float32)
    for start in range(0, seqlen, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < seqlen
        page = tl.load(TABLE + b * stride_bt + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
        off = page[:, None] * stride_kp + (offs_n % PAGE_SIZE)[:, None] * stride_kt + offs_w[None, :]
        k = tl.load(k0 + off, mask=mask_n[:, None], other=0.0)  # [BLOCK_N, W]
        v = tl.load(v0 + off, mask=mask_n[:, None], other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if MODE == 0:
            s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_H, BLOCK_N], log2 units
            s = tl.where(mask_n[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        elif MODE == 1:
            s = tl.dot(q, tl.trans(k))
            acc += tl.dot(s.to(v.dtype), v)
        else:
            total += k.to(tl.float32) + v.to(tl.float32)
    if MODE == 0:
        out = acc / l_i[:, None]
        tl.store(OUT + b * stride_qb + q_rows[:, None] * stride_qh + col, out.to(OUT.dtype.element_ty), mask=mine)
    else:
        tl.store(SINK + b * tl.num_programs(1) + hb, tl.sum(tl.sum(acc, axis=1), axis=0) + tl.sum(tl.sum(total, 1), 0))


def pack_decode(x, out, sink, heads, block_n, stages, mode, dot_f32=False):
    """Launch _pack_kernel over case x (q [B, Hq, D], NHD cache) into out (decode) or sink [B * Hkv / heads]."""
    q, k, v, lens, table = x.args
    group = q.shape[1] // k.shape[2]
    assert k.shape[2] % heads == 0 and k.stride(2) == k.shape[3] and k.stride(3) == 1, "heads must be adjacent rows"
    _pack_kernel[(q.shape[0], k.shape[2] // heads)](
        q, k, v, lens, table, out, sink, q.shape[2] ** -0.5 * LOG2E, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), k.stride(2), table.stride(0), HEADS=heads, GROUP=group, HEAD_DIM=q.shape[2],
        PAGE_SIZE=k.shape[1], BLOCK_H=max(16, triton.next_power_of_2(heads * group)), BLOCK_N=block_n,
        MODE=MODES[mode], DOT_F32=dot_f32, num_warps=4, num_stages=stages,
    )  # fmt: skip


def check_cpu():
    """The decode mode against the float64 reference in the interpreter: ragged lengths, a shuffled page table."""
    from flashdecode.cases import random_paged_case
    from flashdecode.reference import reference_dense

    c = random_paged_case([1, 15, 16, 17, 70], 12, 2, 128, 16, torch.float32, "cpu")
    ref, _ = reference_dense(*c.args)
    for heads, block_n in ((1, 32), (2, 32), (2, 16)):
        out = torch.full_like(c.q, float("nan"))
        pack_decode(c, out, None, heads, block_n, 2, "decode", dot_f32=True)
        err = max_err(out, ref)
        print(f"heads {heads} BLOCK_N {block_n}: max err {err:.2e}")
        assert err < 1e-4, err


def main():
    log = ProbeLog("pack")
    for row in ROWS:
        c, ref, copies = probe_case(row.seqlens, row.num_q_heads, row.num_kv_heads)
        it = itertools.cycle(copies)
        out = torch.empty_like(c.q)
        plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
        res = {"plan": probe_graph_us(lambda: decode_attention(*next(it).args, out=out, plan=plan))}
        sink = torch.empty(row.batch * row.num_kv_heads, device="cuda")
        for (heads, block_n, stages), mode in itertools.product(VARIANTS, MODES):
            if mode == "decode":
                out.fill_(float("nan"))
                pack_decode(c, out, sink, heads, block_n, stages, mode)
                err = max_err(out, ref)
                assert err < 2e-2, f"{row.name()} heads {heads} {block_n}/{stages}: err {err}"
            res[f"{mode}/h{heads}/{block_n}x{stages}"] = probe_graph_us(
                lambda: pack_decode(next(it), out, sink, heads, block_n, stages, mode))
        res["plan again"] = probe_graph_us(lambda: decode_attention(*next(it).args, out=out, plan=plan))
        lines = []
        for mode in MODES:
            cells = "  ".join(f"{k.split('/', 1)[1]} {v:5.1f}" for k, v in res.items() if k.startswith(mode + "/"))
            lines.append(f"{row.name():<15} {mode:<6} {cells}")
        lines.append(f"{row.name():<15} plan   {res['plan']:5.1f} / {res['plan again']:5.1f}")
        log.row(dict(row=row.name(), **{k: round(v, 2) for k, v in res.items()}), "\n".join(lines))
        c = ref = copies = it = None  # free this row's caches
        torch.cuda.empty_cache()
    log.close()


if __name__ == "__main__":
    check_cpu() if sys.argv[1:] == ["check"] else main()
