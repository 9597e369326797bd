"""Why the 12/2 rows' page gather reads slower than a contiguous read of the same 64 MiB (read_floor_probe.py: 16.6 us
flat, 17.3 us with a static one-wave split, against the gather's 19.0-19.5 and the plan's 20.1).

Read-only kernels over a 12/2 case's paged K/V (bf16, head_dim 128, page 16), CUDA-graph timed with the caches
rotated through >= 3x L2. A program reads L tokens of one sequence, T tokens a step in one load of K and one of V
(T x 512 bytes in flight a program), and sums them (so the loads are live). Variants:

* ``table`` — the case's random page table, or ``sorted`` (pages in order: the same reads, sequential in memory);
* ``heads`` — a program per KV head (each token row's 256 bytes, the decode's pattern), or ``both`` (a program reads
  the whole 512-byte row of the two heads: half the programs, contiguous 8 KB pages);
* L (tokens a program), T (tokens a step), warps;
* ``static`` — the decode's static grid (a program = L tokens of a sequence and KV head), U tiles of T tokens
  loaded before any is summed;
* ``dots`` — the static grid pipelined through shared memory: ceiling_probe's gather with the decode's two
  products and no softmax;
* ``pdots/table``, ``pdots/pool`` — the same products over 256-token programs, pages through the table or the pool
  in order: what the table costs a pipelined grid;
* ``shot/table`` and ``shot/pool`` — one load of T tokens a program and no loop, as the flat read does, the pages
  through the table or the pool in order with no table load.

    python scripts/gather_floor_probe.py    # on the GPU machine; writes $OUT/gather_floor.jsonl, a table last
"""

import itertools

import torch
import triton
import triton.language as tl
from ceiling_probe import gather
from read_floor_probe import _flat_kernel, graph_us

from flashdecode import decode_attention, plan_decode
from flashdecode.bench import ProbeLog, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case


@triton.jit
def _program_range(TABLE, L, chunks_per_seq, stride_bt):
    """(KV head h, table row pointer, start): program (c, h) reads tokens [start, start + L) of sequence
    c // chunks_per_seq (every sequence chunks_per_seq * L tokens long)."""
    c = tl.program_id(0)
    row = TABLE + (c // chunks_per_seq).to(tl.int64) * stride_bt
    return tl.program_id(1), row, (c % chunks_per_seq) * L


@triton.jit
def _pg_kernel(
    K, V, TABLE, OUT, L, chunks_per_seq, stride_kp, stride_kt, stride_kh, stride_bt,
    PAGE_SIZE: tl.constexpr, T: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    # program (c, h): chunk c % chunks_per_seq of sequence c // chunks_per_seq (every sequence chunks_per_seq * L
    # tokens long), KV head h (D = 128), or both heads' 256-element rows (one program on axis 1, D = 256)
    h, row, start = _program_range(TABLE, L, chunks_per_seq, stride_bt)
    offs_d = tl.arange(0, D)
    acc = tl.zeros([D], tl.float32)
    base = h.to(tl.int64) * stride_kh
    for t in range(start, start + L, T):
        offs_n = t + tl.arange(0, T)
        page = tl.load(row + offs_n // PAGE_SIZE).to(tl.int64)
        off = base + page[:, None] * stride_kp + (offs_n % PAGE_SIZE)[:, None] * stride_kt + offs_d[None, :]
        k = tl.load(K + off)
        v = tl.load(V + off)
        acc += tl.sum(k.to(tl.float32) + v.to(tl.float32), axis=0)
    tl.store(OUT + tl.program_id(0) * tl.num_programs(1) + h, tl.sum(acc, axis=0))


@triton.jit
def _shot_kernel(
    K, V, TABLE, OUT, seq_len, stride_kp, stride_kt, stride_kh, stride_bt,
    PAGE_SIZE: tl.constexpr, T: tl.constexpr, D: tl.constexpr, PAGED: tl.constexpr,
):  # fmt: skip
    # program (i, h): tokens [i * T, (i + 1) * T) of the flattened batch (T divides seq_len), all loaded at once as
    # the flat read does; pages through TABLE (PAGED), or the pool in order (no table load)
    i = tl.program_id(0)
    h = tl.program_id(1)
    seq = (i * T // seq_len).to(tl.int64)
    offs_n = (i * T) % seq_len + tl.arange(0, T)
    if PAGED:
        page = tl.load(TABLE + seq * stride_bt + offs_n // PAGE_SIZE).to(tl.int64)
    else:
        page = seq * (seq_len // PAGE_SIZE) + offs_n // PAGE_SIZE
    off = h.to(tl.int64) * stride_kh + page[:, None] * stride_kp + (offs_n % PAGE_SIZE)[:, None] * stride_kt
    off += tl.arange(0, D)[None, :]
    k = tl.load(K + off)
    v = tl.load(V + off)
    tl.store(OUT + i * tl.num_programs(1) + h, tl.sum(tl.sum(k.to(tl.float32) + v.to(tl.float32), axis=1), axis=0))


@triton.jit
def _tile_sum(K, V, row, base, t, end, stride_kp, stride_kt, PAGE_SIZE: tl.constexpr, T: tl.constexpr,
              D: tl.constexpr):  # fmt: skip
    # [D] fp32: tokens [t, t + T) of a table row, K + V summed over the tokens (masked past end)
    offs_n = t + tl.arange(0, T)
    mask = offs_n < end
    page = tl.load(row + offs_n // PAGE_SIZE, mask=mask, other=0).to(tl.int64)
    off = base + page[:, None] * stride_kp + (offs_n % PAGE_SIZE)[:, None] * stride_kt + tl.arange(0, D)[None, :]
    k = tl.load(K + off, mask=mask[:, None], other=0.0).to(tl.float32)
    v = tl.load(V + off, mask=mask[:, None], other=0.0).to(tl.float32)
    return tl.sum(k + v, axis=0)


@triton.jit
def _static_kernel(
    K, V, TABLE, OUT, L, chunks_per_seq, stride_kp, stride_kt, stride_kh, stride_bt,
    PAGE_SIZE: tl.constexpr, T: tl.constexpr, D: tl.constexpr, U: tl.constexpr,
):  # fmt: skip
    # the decode's static grid (program = L tokens of one sequence and KV head) reading U tiles of T tokens a step,
    # all U issued before any is summed (U * T * 512 bytes in flight a program, no shared memory)
    h, row, start = _program_range(TABLE, L, chunks_per_seq, stride_bt)
    end = start + L
    base = h.to(tl.int64) * stride_kh
    acc = tl.zeros([D], tl.float32)
    for t in range(start, end, T * U):
        if U == 1:
            acc += _tile_sum(K, V, row, base, t, end, stride_kp, stride_kt, PAGE_SIZE, T, D)
        elif U == 2:
            a = _tile_sum(K, V, row, base, t, end, stride_kp, stride_kt, PAGE_SIZE, T, D)
            b = _tile_sum(K, V, row, base, t + T, end, stride_kp, stride_kt, PAGE_SIZE, T, D)
            acc += a + b
        else:
            a = _tile_sum(K, V, row, base, t, end, stride_kp, stride_kt, PAGE_SIZE, T, D)
            b = _tile_sum(K, V, row, base, t + T, end, stride_kp, stride_kt, PAGE_SIZE, T, D)
            c = _tile_sum(K, V, row, base, t + 2 * T, end, stride_kp, stride_kt, PAGE_SIZE, T, D)
            d = _tile_sum(K, V, row, base, t + 3 * T, end, stride_kp, stride_kt, PAGE_SIZE, T, D)
            acc += (a + b) + (c + d)
    tl.store(OUT + tl.program_id(0) * tl.num_programs(1) + h, tl.sum(acc, axis=0))


@triton.jit
def _dots_kernel(
    K, V, TABLE, OUT, L, chunks_per_seq, stride_kp, stride_kt, stride_kh, stride_bt,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, PAGED: tl.constexpr,
):  # fmt: skip
    # ceiling_probe's dots on _pg_kernel's grid: tiles consumed by the decode's two products (no softmax), so Triton
    # pipelines them through shared memory; pages through TABLE (PAGED) or the pool in order (no table load)
    h, row, start = _program_range(TABLE, L, chunks_per_seq, stride_bt)
    seq = (tl.program_id(0) // chunks_per_seq).to(tl.int64)
    q = (tl.zeros([16, D], tl.float32) + 1.0).to(K.dtype.element_ty)
    acc = tl.zeros([16, D], tl.float32)
    base = h.to(tl.int64) * stride_kh
    offs_d = tl.arange(0, D)
    for t in range(start, start + L, BLOCK_N):
        offs_n = t + tl.arange(0, BLOCK_N)
        if PAGED:
            page = tl.load(row + offs_n // PAGE_SIZE).to(tl.int64)
        else:
            page = seq * (L * chunks_per_seq // PAGE_SIZE) + offs_n // PAGE_SIZE
        off = base + page[:, None] * stride_kp + (offs_n % PAGE_SIZE)[:, None] * stride_kt + offs_d[None, :]
        k = tl.load(K + off)
        v = tl.load(V + off)
        s = tl.dot(q, tl.trans(k))
        acc += tl.dot(s.to(K.dtype.element_ty), v)
    tl.store(OUT + tl.program_id(0) * tl.num_programs(1) + h, tl.sum(tl.sum(acc, axis=1), axis=0))


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
            for chunk, t, w in ((128, 128, 4),):
                progs = len(seqlens) * seqlens[0] // chunk
                o = torch.empty(progs * hk, device="cuda")
                cit = itertools.cycle(copies)

                def read(x):
                    _pg_kernel[(progs, hk)](x.k_cache, x.v_cache, tbl, o, chunk, seqlens[0] // chunk, kp, kt, kh,
                                            tbl.stride(0), PAGE_SIZE=16, T=t, D=d, num_warps=w)  # fmt: skip

                res[f"{table}/{heads}/L{chunk}/T{t}/w{w}"] = graph_us(lambda: read(next(cit)))
        # the decode's static grid, U tiles of T tokens issued together
        for chunk, t, u, w in itertools.product((256,), (32, 64), (1, 4), (4,)):  # run 5 (784703c): the rest slower
            if chunk > seqlens[0] or t * u > chunk:
                continue
            progs = len(seqlens) * seqlens[0] // chunk
            o = torch.empty(progs * 2, device="cuda")
            cit = itertools.cycle(copies)

            def static(x):
                _static_kernel[(progs, 2)](x.k_cache, x.v_cache, c.block_table, o, chunk, seqlens[0] // chunk, kp, kt,
                                           kh, c.block_table.stride(0), PAGE_SIZE=16, T=t, D=128, U=u,
                                           num_warps=w)  # fmt: skip

            res[f"static/L{chunk}/T{t}/u{u}/w{w}"] = graph_us(lambda: static(next(cit)))
        # the same static grid pipelined through shared memory by Triton: ceiling_probe's gather consumed by the
        # decode's two products without the softmax (its "dots"), on the decode's tiles
        for chunk, bn, stages in itertools.product((256, 512), (32, 64), (3, 4)):
            if chunk > seqlens[0]:
                continue
            chunks = [(b, s0, min(s0 + chunk, n)) for b, n in enumerate(seqlens) for s0 in range(0, n, chunk)]
            ch = torch.tensor(chunks, dtype=torch.int32, device="cuda").T.contiguous()
            gsink = torch.empty(len(chunks) * 2, device="cuda")
            cit = itertools.cycle(copies)
            res[f"dots/L{chunk}/bn{bn}/s{stages}"] = graph_us(
                lambda: gather(next(cit), ch, gsink, 2, bn, stages, dots=True))
        # the same with the pages through the table or the pool in order: what the table costs a pipelined grid
        for paged, bn, stages in itertools.product((True, False), (32, 64), (3, 4)):
            o = torch.empty(len(seqlens) * seqlens[0] // 256 * 2, device="cuda")
            cit = itertools.cycle(copies)

            def dots(x):
                _dots_kernel[(o.numel() // 2, 2)](x.k_cache, x.v_cache, c.block_table, o, 256, seqlens[0] // 256, kp,
                                                  kt, kh, c.block_table.stride(0), PAGE_SIZE=16, BLOCK_N=bn, D=128,
                                                  PAGED=paged, num_warps=4, num_stages=stages)  # fmt: skip

            res[f"pdots/{'table' if paged else 'pool'}/L256/bn{bn}/s{stages}"] = graph_us(lambda: dots(next(cit)))
        # one load of T tokens a program, no loop (the flat read's shape), through the table or the pool in order
        for paged, heads, t, w in itertools.product((True, False), ("one", "both"), (16, 32, 64), (4, 8, 16)):
            hk, d = (2, 128) if heads == "one" else (1, 256)
            progs = len(seqlens) * seqlens[0] // t
            o = torch.empty(progs * hk, device="cuda")
            cit = itertools.cycle(copies)

            def shot(x):
                _shot_kernel[(progs, hk)](x.k_cache, x.v_cache, c.block_table, o, seqlens[0], kp, kt, kh,
                                          c.block_table.stride(0), PAGE_SIZE=16, T=t, D=d, PAGED=paged,
                                          num_warps=w)  # fmt: skip

            res[f"shot/{'table' if paged else 'pool'}/{heads}/T{t}/w{w}"] = graph_us(lambda: shot(next(cit)))
        log.record(dict(row=name, plan=round(plan_us, 2), **{k: round(v, 2) for k, v in res.items()}))
        for fam in ("random/one", "random/both", "sorted/one", "sorted/both", "shot/table/one", "shot/table/both",
                    "shot/pool/one", "shot/pool/both", "static", "dots", "pdots/table", "pdots/pool"):
            v, k = min((v, k) for k, v in res.items() if k.startswith(fam + "/"))
            log.line(f"{name:<14} {fam:<16} {v:6.2f} us ({k})")
        log.line(f"{name:<14} plan {plan_us:6.2f} us")
        copies = cit = None
    log.close()


if __name__ == "__main__":
    main()
