"""Can a group-1 (MHA) split kernel read the 403 MB 12/12 rows at the page-gather's rate? ceiling_probe.py mha
measured the decode's page pattern read with no math at 93.5-93.8 µs (4300 GB/s: 2048-token chunks, 64-token tiles
loaded into registers) against the plan's 97.1-98.6. This probe times, over the same rotated caches:

* ``gather`` / ``dots`` — ceiling_probe's kernels: the loads alone, and the loads consumed by the decode's two
  tensor-core products (q padded to 16 rows, tiles through shared memory) without the softmax;
* ``regs`` — the whole online softmax of one query row on the CUDA cores with the tiles in registers: s = q . k
  reduced over the head dim, and the output kept per token, acc [BLOCK_N, D] = acc * alpha + p v, reduced over the
  tokens once at the end (the N reduction of every tile is what made the earlier CUDA-core products slower);
  each program writes its chunk's partial output and LSE, checked against decode_attention after a merge in torch;
* ``plan`` — decode_attention with plan_decode's plan (partial, merge and all).

    python scripts/mha_regs_probe.py        # on the GPU machine; writes $OUT/mha_regs.jsonl, prints a table last
"""

import itertools

import torch
import triton
import triton.language as tl
from ceiling_probe import MHA_ROWS, gather, graph_us, program_chunk

from flashdecode import decode_attention, plan_decode
from flashdecode.bench import ProbeLog, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case

LOG2E = 1.4426950408889634


@triton.jit
def _regs_kernel(
    Q, K, V, TABLE, CHUNKS, O_PART, LSE_PART, stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_bt,
    qk_scale, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # program (chunk c = (seq, start, end) of CHUNKS [3, n], head h); one query row (group 1)
    c, seq, start, end = program_chunk(CHUNKS)
    h = tl.program_id(1)
    num_heads = tl.num_programs(1)
    offs_d = tl.arange(0, BLOCK_D)
    # [BLOCK_D] fp32, the scale in log2 units folded in
    q = tl.load(Q + seq * stride_qb + h * stride_qh + offs_d).to(tl.float32) * qk_scale
    k0 = K + h.to(tl.int64) * stride_kh
    v0 = V + h.to(tl.int64) * stride_kh
    m_i = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), axis=0)
    # per-token running sums of p and of p v, rescaled with the running max; reduced over the tokens at the end
    l_n = tl.zeros([BLOCK_N], tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for t in range(start, end, BLOCK_N):
        offs_n = t + tl.arange(0, BLOCK_N)
        mask = offs_n < end
        page = tl.load(TABLE + seq * stride_bt + offs_n // PAGE_SIZE, mask=mask, other=0).to(tl.int64)
        off = page[:, None] * stride_kp + (offs_n % PAGE_SIZE)[:, None] * stride_kt + offs_d[None, :]
        k = tl.load(k0 + off, mask=mask[:, None], other=0.0)
        v = tl.load(v0 + off, mask=mask[:, None], other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
        s = tl.where(mask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        l_n = l_n * alpha + p
        acc = acc * alpha + p[:, None] * v.to(tl.float32)
        m_i = m_new
    l_i = tl.sum(l_n, axis=0)
    out = tl.sum(acc, axis=0) / l_i
    row = c.to(tl.int64) * num_heads + h
    tl.store(O_PART + row * BLOCK_D + offs_d, out)
    tl.store(LSE_PART + row, (m_i + tl.log2(l_i)) * 0.6931471805599453)


def regs(x, chunks, o_part, lse_part, block_n, warps, stages):
    """Launch _regs_kernel over case x (group 1): chunks int32 [3, n]; o_part fp32 [n, H, D], lse_part [n, H]."""
    q, k = x.q, x.k_cache
    _regs_kernel[(chunks.shape[1], k.shape[2])](
        q, k, x.v_cache, x.block_table, chunks, o_part, lse_part, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), k.stride(2), x.block_table.stride(0), k.shape[3] ** -0.5 * LOG2E, PAGE_SIZE=k.shape[1],
        BLOCK_N=block_n, BLOCK_D=k.shape[3], num_warps=warps, num_stages=stages,
    )  # fmt: skip


def merge(chunk_list, o_part, lse_part, batch):
    """[B, H, D] from the partials, in float64 (the probe's check, not a kernel)."""
    seqs = torch.tensor([b for b, _, _ in chunk_list], device=o_part.device)
    lse = lse_part.double()
    m = torch.full((batch, lse.shape[1]), float("-inf"), dtype=torch.float64, device=o_part.device)
    m = m.index_reduce_(0, seqs, lse, "amax")
    w = torch.exp(lse - m[seqs])
    den = torch.zeros_like(m).index_add_(0, seqs, w)
    num = torch.zeros(batch, *o_part.shape[1:], dtype=torch.float64, device=o_part.device)
    num.index_add_(0, seqs, w[:, :, None] * o_part.double())
    return num / den[:, :, None]


def main():
    log = ProbeLog("mha_regs")
    l2 = _l2_bytes("cuda")
    for row in MHA_ROWS:
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, 128, 16, torch.bfloat16, "cuda",
                              spare_pages=0)  # fmt: skip
        kv_bytes = row.kv_bytes()
        copies = rotation_copies(c, l2)
        out = torch.empty_like(c.q)
        want = decode_attention(*c.args).float()
        res = {}
        cit = itertools.cycle(copies)
        decode_plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
        res["plan"] = graph_us(lambda: decode_attention(*next(cit).args, out=out, plan=decode_plan))
        for size in (1024, 2048):
            chunk_list = [(b, s, min(s + size, L)) for b, L in enumerate(row.seqlens) for s in range(0, L, size)]
            ch = torch.tensor(chunk_list, dtype=torch.int32, device="cuda").T.contiguous()
            n, H = len(chunk_list), row.num_kv_heads
            sink = torch.empty(n * H, device="cuda")
            o_part = torch.empty(n, H, 128, device="cuda")
            lse_part = torch.empty(n, H, device="cuda")
            res[f"gather/{size}/bn64s4"] = graph_us(lambda: gather(next(cit), ch, sink, H, 64, 4))
            for bn, stages in ((64, 3), (64, 4), (128, 2), (32, 4)):
                res[f"dots/{size}/bn{bn}s{stages}"] = graph_us(
                    lambda: gather(next(cit), ch, sink, H, bn, stages, dots=True))
            for bn, warps, stages in itertools.product((32, 64, 128), (4, 8), (1, 2, 3)):
                try:
                    regs(c, ch, o_part, lse_part, bn, warps, stages)
                except Exception as e:  # out of resources: say so and go on
                    print(f"{row.name()} regs {size} bn{bn}w{warps}s{stages}: {type(e).__name__}", flush=True)
                    continue
                err = (merge(chunk_list, o_part, lse_part, row.batch).float() - want).abs().max().item()
                if not err < 2e-2:
                    raise SystemExit(f"{row.name()} regs {size} bn{bn}w{warps}s{stages}: max error {err}")
                res[f"regs/{size}/bn{bn}w{warps}s{stages}"] = graph_us(
                    lambda: regs(next(cit), ch, o_part, lse_part, bn, warps, stages))
        rec = dict(row=row.name(), kv_mb=round(kv_bytes / 1e6, 1), **{k: round(v, 2) for k, v in res.items()})

        def best(prefix):
            return min((v, k) for k, v in res.items() if k.startswith(prefix))

        g, d, r = best("gather"), best("dots"), best("regs")
        line = (f"{row.name():<14} gather {g[0]:>6.1f}  dots {d[0]:>6.1f} ({d[1]})  regs {r[0]:>6.1f} "
                f"({kv_bytes / r[0] / 1e3:>5.0f} GB/s, {r[1]})  plan {res['plan']:>6.1f}")  # fmt: skip
        log.row(rec, line)
    log.close()


if __name__ == "__main__":
    main()
