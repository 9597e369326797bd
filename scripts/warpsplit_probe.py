"""A single pass whose warps keep their own softmax states (probe, not in the library).

single_cost_probe found the single pass 1.0 µs slower than the same page gather with the decode's two products and
no softmax (256 x 256 12/2: 19.9 against 18.9 µs, 32-token tiles, 3 stages, 512 programs). In the library's tile
the 16 query rows x BLOCK_N tokens of the scores are spread over the warps by token, so each tile's row max is a
reduction across warps (shared memory and a barrier), and so is p's layout change for the p . V product. Here the
tile is G pages of 16 tokens, and the products are batched over the pages ([G, 16, D] tiles, 3-D tl.dot), so that
each page's scores can stay in one warp: G running states (m, l, acc [G, 16, D]), merged once at the end.

    python scripts/warpsplit_probe.py          # GPU: times it beside the plan and the dots kernel
    TRITON_INTERPRET=1 python scripts/warpsplit_probe.py check   # CPU: against the float64 reference
"""

import itertools
import os
import sys

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _warpsplit_kernel(
    Q, K, V, SEQLENS, TABLE, OUT, qk_scale,
    stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_bt, stride_ob, stride_oh,
    GROUP: tl.constexpr, G: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    # program (KV head, sequence): the GROUP query rows (padded to 16) over the sequence, G pages a tile
    h = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    seqlen = tl.load(SEQLENS + b)
    offs_h = tl.arange(0, 16)
    offs_d = tl.arange(0, BLOCK_D)
    offs_t = tl.arange(0, PAGE)
    offs_g = tl.arange(0, G)
    mask_h = offs_h < GROUP
    q_ptrs = Q + b * stride_qb + (h * GROUP + offs_h)[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_h[:, None], other=0.0)
    # [G, 16, D]: every page's product sees the same query rows
    qb = tl.broadcast_to(q[None, :, :], (G, 16, BLOCK_D))
    m_i = tl.full([G, 16], -1.0e30, tl.float32)
    l_i = tl.zeros([G, 16], tl.float32)
    acc = tl.zeros([G, 16, BLOCK_D], tl.float32)
    k0 = K + h.to(tl.int64) * stride_kh
    v0 = V + h.to(tl.int64) * stride_kh
    row = TABLE + b * stride_bt
    # [G] one page id per group (a tile starts on a page edge), loaded a tile ahead: the pipeliner then gives K and V
    # STAGES - 1 buffers (with the table load in the loop it kept one)
    page = tl.load(row + offs_g, mask=offs_g * PAGE < seqlen, other=0)
    for t in tl.range(0, seqlen, G * PAGE, num_stages=STAGES):
        first = t + offs_g * PAGE
        nxt = first + G * PAGE
        page_next = tl.load(row + nxt // PAGE, mask=nxt < seqlen, other=0)
        # [G, PAGE] token positions
        tok = first[:, None] + offs_t[None, :]
        mask = tok < seqlen
        off = page.to(tl.int64)[:, None, None] * stride_kp + offs_t[None, :, None] * stride_kt + offs_d[None, None, :]
        k = tl.load(k0 + off, mask=mask[:, :, None], other=0.0)
        v = tl.load(v0 + off, mask=mask[:, :, None], other=0.0)
        # [G, 16, PAGE] scores in log2 units
        s = tl.dot(qb, tl.permute(k, (0, 2, 1))) * qk_scale
        s = tl.where(mask[:, None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=2))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, :, None])
        l_i = l_i * alpha + tl.sum(p, axis=2)
        acc = acc * alpha[:, :, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
        page = page_next
    # merge the G states: weights exp2(m_g - max_g m_g); a group that saw no token has l_g = 0
    m_all = tl.max(m_i, axis=0)
    w = tl.exp2(m_i - m_all[None, :])
    l_all = tl.sum(l_i * w, axis=0)
    out = tl.sum(acc * w[:, :, None], axis=0) / tl.where(l_all == 0.0, 1.0, l_all)[:, None]
    o_ptrs = OUT + b * stride_ob + (h * GROUP + offs_h)[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=mask_h[:, None])


def warpsplit(q, k_cache, v_cache, cache_seqlens, block_table, out, pages=4, stages=3, warps=4):
    """out [B, Hq, D] from q [B, Hq, D] and [num_pages, page, Hkv, D] caches (group <= 16, page 16)."""
    batch, num_q_heads, head_dim = q.shape
    _, page, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    assert group <= 16 and head_dim == triton.next_power_of_2(head_dim), (group, head_dim)
    _warpsplit_kernel[(num_kv_heads, batch)](
        q, k_cache, v_cache, cache_seqlens, block_table, out, head_dim**-0.5 * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, G=pages, BLOCK_D=head_dim, PAGE=page, STAGES=stages, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def check():
    from flashdecode.cases import random_paged_case
    from flashdecode.reference import reference_dense

    for lens, hq, hkv, pages in [([37, 70, 5, 0], 12, 2, 2), ([130, 16, 1], 28, 4, 4), ([64, 100], 8, 8, 2)]:
        c = random_paged_case(lens, hq, hkv, 64, 16, torch.float16)
        ref, _ = reference_dense(*c.args)
        out = torch.full_like(c.q, float("nan"))
        warpsplit(*c.args, out, pages=pages)
        err = (out.double() - ref).abs().max().item()
        print(f"{lens} {hq}/{hkv} pages {pages}: max err {err:.2e}")
        assert err < 2e-3, err


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ceiling_probe import gather

    from flashdecode import decode_attention, plan_decode
    from flashdecode.bench import ProbeLog, Row, probe_case
    from flashdecode.bench import probe_graph_us as graph_us

    rows = [Row([256] * 256, 12, 2), Row([256] * 128, 28, 4), Row([512] * 128, 12, 2), Row([1024] * 64, 12, 2),
            Row([2048] * 64, 32, 8)]  # fmt: skip
    log = ProbeLog("warpsplit")
    for row in rows:
        case, ref, copies = probe_case(row.seqlens, row.num_q_heads, row.num_kv_heads)
        out = torch.empty_like(case.q)
        res, errs = {}, {}
        cit = itertools.cycle(copies)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        res["plan"] = graph_us(lambda: decode_attention(*next(cit).args, out=out, plan=plan))
        chunks = [(b, 0, n) for b, n in enumerate(row.seqlens)]
        ch = torch.tensor(chunks, dtype=torch.int32, device="cuda").T.contiguous()
        sink = torch.empty(len(chunks) * row.num_kv_heads, device="cuda")
        res["dots t32s3"] = graph_us(lambda: gather(next(cit), ch, sink, row.num_kv_heads, 32, 3, dots=True))
        for pages, stages, warps in [(2, 3, 2), (2, 3, 4), (4, 3, 4), (4, 4, 4), (2, 4, 2), (8, 3, 8), (8, 3, 4)]:
            key = f"ws p{pages}s{stages}w{warps}"
            try:
                out.fill_(float("nan"))
                warpsplit(*case.args, out, pages, stages, warps)
                errs[key] = (out.double() - ref.double()).abs().max().item()
                res[key] = graph_us(lambda: warpsplit(*next(cit).args, out, pages, stages, warps))
            except Exception as e:  # a config that does not compile or fit must not stop the rest
                print(f"{row.name()} {key}: {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)
        rec = dict(row=row.name(), **{k: round(v, 2) for k, v in res.items()},
                   max_err=max(errs.values(), default=None))  # fmt: skip
        line = f"{row.name():<14} " + "  ".join(f"{k} {v:.1f}" for k, v in res.items())
        log.row(rec, line + f"  max err {max(errs.values(), default=float('nan')):.1e}")
    log.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["check"]:
        check()
    elif sys.argv[1:]:
        sys.exit(f"usage: python scripts/warpsplit_probe.py [check], got {' '.join(sys.argv[1:])!r}")
    else:
        main()
