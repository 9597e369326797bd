"""Could the split 12/2 rows run as the multi-wave Gluon single pass over their chunks? A bound, before writing a
Gluon split partial: each sequence cut into chunks of C tokens, the chunks run as a batch of B * L / C sequences of
C tokens through ``gluon_single`` (q repeated, the block table's rows cut into the chunks' pages, fp32 outputs and
LSEs: the partials), then merged by a small Triton kernel here (one program per sequence and query head, its
chunks by their LSE). Every row's merged output is checked against float64 first.

Columns, graph µs: the library's plan; the chunk pass alone (the partials' read and write: what a fused merge
could at best add nothing to); the chunk pass then the merge launch (what a combine launch costs, without PDL).

    python scripts/gluon_split_probe.py [--rows B,L;...] [--chunk 256]   # on the GPU; $OUT/gluon_split.jsonl
"""

import argparse
import itertools

import torch
import triton
import triton.language as tl

from flashdecode import decode_attention, gluon_single, plan_decode
from flashdecode.bench import ProbeLog, probe_case, probe_graph_us, probe_rows

ROWS = [(64, 1024), (16, 4096), (4, 16384), (1, 65536), (256, 256)]


@triton.jit
def _merge_kernel(O_PART, LSE_PART, OUT, splits, num_q_heads, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    """OUT[b, h] = sum_c exp(lse_c - LSE) o_c over the splits chunks of sequence b (rows b * splits + c of the
    [chunks, Hq, D] partials); grid (B, Hq)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM)
    m = tl.full([1], float("-inf"), tl.float32)
    l_sum = tl.zeros([1], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for s0 in range(0, splits, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        rows = (b * splits + offs_s) * num_q_heads + h
        lse = tl.load(LSE_PART + rows, mask=offs_s < splits, other=float("-inf"))
        o = tl.load(O_PART + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=(offs_s < splits)[:, None], other=0.0)
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        alpha = tl.exp(m - m_new)
        w = tl.exp(lse - m_new)
        l_sum = l_sum * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * o, axis=0)
        m = m_new
    tl.store(OUT + (b * num_q_heads + h) * HEAD_DIM + offs_d, (acc / l_sum).to(OUT.dtype.element_ty))


def chunked(c, chunk):
    """The case's sequences cut into chunks of `chunk` tokens, as a batch of their own (q repeated, table rows cut)."""
    batch, length = c.q.shape[0], int(c.cache_seqlens[0])
    splits, pages = length // chunk, chunk // c.k_cache.shape[1]
    q = c.q.repeat_interleave(splits, dim=0)
    table = c.block_table[:, : splits * pages].reshape(batch * splits, pages).contiguous()
    lens = torch.full((batch * splits,), chunk, dtype=torch.int32, device=c.q.device)
    return q, c.k_cache, c.v_cache, lens, table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="", help="B,L;... (12/2 heads) instead of ROWS")
    ap.add_argument("--chunk", type=int, default=256, help="tokens a chunk")
    args = ap.parse_args()
    rows = probe_rows(args.rows, ROWS)
    log = ProbeLog("gluon_split")
    for batch, length in rows:
        case, ref, copies = probe_case([length] * batch, 12, 2)
        splits = length // args.chunk
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        scale = 128**-0.5
        out = torch.empty_like(case.q)
        parts = [chunked(c, args.chunk) for c in copies]
        o_part = torch.empty(batch * splits, 12, 128, dtype=torch.float32, device="cuda")
        lse_part = torch.empty(batch * splits, 12, dtype=torch.float32, device="cuda")

        def chunk_pass(p):
            gluon_single.decode_single_gluon(*p, scale, o_part, lse_part)

        def merged(p):
            chunk_pass(p)
            _merge_kernel[(batch, 12)](o_part, lse_part, out, splits, 12, HEAD_DIM=128, BLOCK_S=16)

        out.fill_(float("nan"))
        merged(parts[0])
        err = (out.double() - ref).abs().max().item()
        variants = {"plan": lambda i: decode_attention(*copies[i].args, out=out, plan=plan),
                    "chunks": lambda i: chunk_pass(parts[i]), "chunks+merge": lambda i: merged(parts[i])}  # fmt: skip
        times = {k: [] for k in variants}
        for _ in range(2):
            for key, fn in variants.items():
                it = itertools.cycle(range(len(copies)))
                times[key].append(probe_graph_us(lambda fn=fn: fn(next(it))) if err < 2e-2 else float("nan"))
        name = f"{batch}x{length} 12/2"
        log.row(dict(row=name, chunk=args.chunk, splits=splits, plan=f"{plan.backend}/{plan.num_splits}", err=err,
                     us=times),
                f"{name:<14} {splits:4d} chunks of {args.chunk}  err {err:.1e}  "
                + "  ".join(f"{k} {min(v):7.2f} ({max(v):.2f})" for k, v in times.items()))  # fmt: skip
    log.close()


if __name__ == "__main__":
    main()
