"""Why the 12/2 rows' page gather reads slower than a contiguous read of the same 64 MiB (read_floor_probe.py: 16.6 us
flat, 17.3 us with a static one-wave split, against the gather's 19.0-19.5 and the plan's 20.1).

Read-only kernels over a 12/2 case's paged K/V (bf16, head_dim 128, page 16), CUDA-graph timed with the caches
rotated through >= 3x L2. A program reads L tokens of one sequence, T tokens a step in one load of K and one of V
(T x 512 bytes in flight a program), and sums them (so the loads are live). Variants:

* ``table`` — the case's random page table, or ``sorted`` (pages in order: the same reads, sequential in memory);
* ``heads`` — a program per KV head (each token row's 256 bytes, the decode's pattern), or ``both`` (a program reads
  the whole 512-byte row of the two heads: half the programs, contiguous 8 KB pages);
* L (tokens a program), T (tokens a step), warps.

    python scripts/gather_floor_probe.py    # on the GPU machine; writes $OUT/gather_floor.jsonl, a table last
"""

import itertools

import torch
import triton
import triton.language as tl
from read_floor_probe import _flat_kernel, graph_us

from flashdecode import decode_attention, plan_decode
from flashdecode.bench import ProbeLog, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case


@triton.jit
def _pg_kernel(
    K, V, TABLE, OUT, L, chunks_per_seq, stride_kp, stride_kt, stride_kh, stride_bt,
    PAGE_SIZE: tl.constexpr, T: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    # program (c, h): chunk c % chunks_per_seq of sequence c // chunks_per_seq (every sequence chunks_per_seq * L
    # tokens long), KV head h (D = 128), or both heads' 256-element rows (one program on axis 1, D = 256)
    c = tl.program_id(0)
    h = tl.program_id(1)
    seq = (c // chunks_per_seq).to(tl.int64)
    start = (c % chunks_per_seq) * L
    offs_d = tl.arange(0, D)
    acc = tl.zeros([D], tl.float32)
    base = h.to(tl.int64) * stride_kh
    for t in range(start, start + L, T):
        offs_n = t + tl.arange(0, T)
        page = tl.load(TABLE + seq * stride_bt + offs_n // PAGE_SIZE).to(tl.int64)
        off = base + page[:, None] * stride_kp + (offs_n % PAGE_SIZE)[:, None] * stride_kt + offs_d[None, :]
        k = tl.load(K + off)
        v = tl.load(V + off)
        acc += tl.sum(k.to(tl.float32) + v.to(tl.float32), axis=0)
    tl.store(OUT + c * tl.num_programs(1) + h, tl.sum(acc, axis=0))


def main():
    log = ProbeLog("gather_floor")
    l2 = _l2_bytes("cuda")
    n = 32 << 20  # 64 MiB of bf16: the flat read, for reference in this process
    bufs = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(-(-3 * l2 // (2 * n)) + 1)]
    it = itertools.cycle(bufs)
    sink = torch.empty(n // 8192, device="cuda")
    flat = graph_us(lambda: _flat_kernel[(n // 8192,)](next(it), sink, E=8192, CG=False, num_warps=8))
    bufs = it = None
    log.row(dict(what="flat", us=round(flat, 2)), f"contiguous 64 MiB, flat/8192/w8: {flat:.2f} us")
    for seqlens in ([256] * 256, [65536]):
        c = random_paged_case(seqlens, 12, 2, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
        name = f"{len(seqlens)}x{seqlens[0]} 12/2"
        copies = rotation_copies(c, l2)
        out = torch.empty_like(c.q)
        cit = itertools.cycle(copies)
        plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
        plan_us = graph_us(lambda: decode_attention(*next(cit).args, out=out, plan=plan))
        used = seqlens[0] // 16  # pages a sequence; the table's further columns are never read
        sorted_table = torch.zeros_like(c.block_table)
        sorted_table[:, :used] = torch.arange(len(seqlens) * used, device="cuda").view(len(seqlens), used)
        kp, kt, kh, _ = c.k_cache.stride()
        res = {}
        for table, heads in itertools.product(("random", "sorted"), ("one", "both")):
            tbl = c.block_table if table == "random" else sorted_table
            hk, d = (2, 128) if heads == "one" else (1, 256)
            for chunk, t, w in itertools.product((128, 256, 512), (32, 64, 128), (4, 8)):
                if chunk > seqlens[0] or t > chunk:
                    continue
                progs = len(seqlens) * seqlens[0] // chunk
                o = torch.empty(progs * hk, device="cuda")
                cit = itertools.cycle(copies)

                def read(x):
                    _pg_kernel[(progs, hk)](x.k_cache, x.v_cache, tbl, o, chunk, seqlens[0] // chunk, kp, kt, kh,
                                            tbl.stride(0), PAGE_SIZE=16, T=t, D=d, num_warps=w)  # fmt: skip

                us = graph_us(lambda: read(next(cit)))
                res[f"{table}/{heads}/L{chunk}/T{t}/w{w}"] = us
        log.record(dict(row=name, plan=round(plan_us, 2), **{k: round(v, 2) for k, v in res.items()}))
        for table, heads in itertools.product(("random", "sorted"), ("one", "both")):
            v, k = min((v, k) for k, v in res.items() if k.startswith(f"{table}/{heads}/"))
            log.line(f"{name:<14} {table:>6} table, {heads:>4} head(s) a program: {v:6.2f} us ({k})")
        log.line(f"{name:<14} plan {plan_us:6.2f} us")
        copies = cit = None
    log.close()


if __name__ == "__main__":
    main()
