"""What the small anchor rows could take at best on this GPU: read-only kernels over the same bytes, CUDA-graph timed
with the caches rotated out of L2, next to the decode kernels. Run on the GPU machine; writes $OUT/ceiling.jsonl and
prints a table last.

Per row:
* ``launch`` — a graph of 1 (and 3, the planned split-K path's count) empty kernels: the launch floor.
* ``sum`` — ``torch.sum`` over a contiguous buffer of the row's K+V bytes: a library streaming read.
* ``read/P`` — a Triton kernel streaming the same contiguous bytes with P programs (16 KB loads).
* ``gather/C`` — the decode access pattern without the math: one program per (chunk of C tokens, KV head) loads the
  block-table entries and the K and V tiles of its chunk, through the row's own random page table, and sums them.
  C = the planner's chunk, and 2x / 4x it; tiles of the decode tile's BLOCK_N and stages, 128 tokens at 2 stages and
  64 at 4.
* ``auto`` — decode_attention(backend="auto") on the same row, ``plan`` — with ``plan_decode``'s plan (what the
  anchor grid's headline column times), and ``single``: the single-pass kernel.

* ``dots/C`` (``dots`` only) — the gather's loads consumed by the decode's two products without the softmax
  (s = q K^T, acc += s V, q = ones), so that Triton pipelines them through shared memory as in the decode kernels.

    python scripts/ceiling_probe.py [12/2]     # 12/2: only the 12/2 rows and 8 x 2048 28/4
    python scripts/ceiling_probe.py dots       # those rows: gather, dots and the plan (no contiguous reads)
    python scripts/ceiling_probe.py mha        # the 403 MB 12/12 rows (the 4.2 TB/s target), with GB/s
"""

import itertools
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, plan_decode, triton_splitk
from flashdecode.bench import ProbeLog, Row, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.triton_common import launch_config
from flashdecode.triton_single import decode_single

ROWS = [
    Row([128], 28, 4), Row([128] * 8, 28, 4), Row([2048], 28, 4), Row([2048] * 8, 28, 4),
    Row([256] * 256, 12, 2), Row([1024] * 64, 12, 2), Row([4096] * 16, 12, 2), Row([65536], 12, 2),
    Row([131072], 12, 2), Row([8192], 32, 32),
]  # fmt: skip
# the anchor grid's 403 MB rows, where the target is 4.2 TB/s (96 us)
MHA_ROWS = [Row([256] * 256, 12, 12), Row([1024] * 64, 12, 12), Row([4096] * 16, 12, 12), Row([16384] * 4, 12, 12),
            Row([65536], 12, 12)]  # fmt: skip


@triton.jit
def _empty_kernel(X):
    pass


@triton.jit
def _read_kernel(X, OUT, n, per_prog, BLOCK: tl.constexpr):
    # per_prog elements (a multiple of BLOCK) from pid * per_prog; fp32 sum so the loads are not dead code
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    start = pid.to(tl.int64) * per_prog
    for i in range(0, per_prog, BLOCK):
        offs = start + i + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


@triton.jit
def program_chunk(CHUNKS):
    """(c, seq int64, start, end): this program's chunk, c = program_id(0), from CHUNKS [3, n] (rows seq, start,
    end)."""
    c = tl.program_id(0)
    n_chunks = tl.num_programs(0)
    seq = tl.load(CHUNKS + c).to(tl.int64)
    return c, seq, tl.load(CHUNKS + n_chunks + c), tl.load(CHUNKS + 2 * n_chunks + c)


@triton.jit
def _gather_kernel(
    K, V, TABLE, CHUNKS, OUT, stride_kp, stride_kt, stride_kh, stride_bt,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOTS: tl.constexpr = False,
):  # fmt: skip
    # chunk c = (seq, start, end) from CHUNKS [3, n]; program (c, kv head). The K and V tiles are summed in registers,
    # or with DOTS consumed as the decode consumes them, by its two products without the softmax (s = q K^T
    # [16, BLOCK_N], acc += s V [16, BLOCK_D], q = ones), so that Triton pipelines them through shared memory
    c, seq, start, end = program_chunk(CHUNKS)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    if DOTS:
        q = (tl.zeros([16, BLOCK_D], tl.float32) + 1.0).to(K.dtype.element_ty)
        acc = tl.zeros([16, BLOCK_D], tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    k0 = K + h.to(tl.int64) * stride_kh
    v0 = V + h.to(tl.int64) * stride_kh
    for t in range(start, end, BLOCK_N):
        offs_n = t + tl.arange(0, BLOCK_N)
        mask = offs_n < end
        page = tl.load(TABLE + seq * stride_bt + offs_n // PAGE_SIZE, mask=mask, other=0).to(tl.int64)
        off = page[:, None] * stride_kp + (offs_n % PAGE_SIZE)[:, None] * stride_kt + offs_d[None, :]
        k = tl.load(k0 + off, mask=mask[:, None], other=0.0)
        v = tl.load(v0 + off, mask=mask[:, None], other=0.0)
        if DOTS:
            s = tl.dot(q, tl.trans(k))
            acc += tl.dot(s.to(K.dtype.element_ty), v)
        else:
            acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(OUT + c * tl.num_programs(1) + h, tl.sum(tl.sum(acc, axis=1), axis=0))


def gather(x, chunks, sink, num_kv_heads, block_n, stages, dots=False):
    """Launch _gather_kernel over case x's cache: chunks int32 [3, n] (seq, start, end), sink fp32 [n * Hkv]."""
    _gather_kernel[(chunks.shape[1], num_kv_heads)](
        x.k_cache, x.v_cache, x.block_table, chunks, sink, x.k_cache.stride(0), x.k_cache.stride(1),
        x.k_cache.stride(2), x.block_table.stride(0), PAGE_SIZE=x.k_cache.shape[1], BLOCK_N=block_n,
        BLOCK_D=x.k_cache.shape[3], DOTS=dots, num_warps=4, num_stages=stages,
    )  # fmt: skip


def graph_us(fn):
    return do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3


def main():
    if sys.argv[1:] not in ([], ["12/2"], ["dots"], ["mha"]):
        sys.exit(f"usage: python scripts/ceiling_probe.py [12/2 | dots | mha], got {' '.join(sys.argv[1:])!r}")
    dots = sys.argv[1:] == ["dots"]
    log = ProbeLog("ceiling")
    l2 = _l2_bytes("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    dummy = torch.zeros(1, device="cuda")
    launch1 = graph_us(lambda: _empty_kernel[(1,)](dummy))
    launch3 = graph_us(lambda: [_empty_kernel[(1,)](dummy) for _ in range(3)])
    log.row(dict(what="launch", k1=round(launch1, 2), k3=round(launch3, 2)),
            f"launch floor: 1 kernel {launch1:.1f} us, 3 kernels {launch3:.1f} us")
    rows = ROWS
    if sys.argv[1:] in (["12/2"], ["dots"]):
        small = {Row([2048] * 8, 28, 4).name()}
        rows = [r for r in ROWS if (r.num_q_heads, r.num_kv_heads) == (12, 2) or r.name() in small]
    if sys.argv[1:] == ["mha"]:
        rows = MHA_ROWS
    for row in rows:
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, 128, 16, torch.bfloat16, "cuda",
                              spare_pages=0)  # fmt: skip
        kv_bytes = row.kv_bytes()
        res = {}
        # contiguous streams of the same bytes (K+V of the valid tokens), rotated like the cache copies
        n = kv_bytes // 2
        bufs = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(max(1, -(-3 * l2 // kv_bytes)))]
        it = itertools.cycle(bufs)
        res["sum"] = graph_us(lambda: next(it).sum())
        for progs in () if dots else (sms, 2 * sms, 4 * sms, 8 * sms):
            block = 8192
            per = -(-n // progs)
            per = -(-per // block) * block
            partial = torch.empty(progs, device="cuda")
            res[f"read/{progs}"] = graph_us(lambda: _read_kernel[(progs,)](next(it), partial, n, per, BLOCK=block,
                                                                           num_warps=8))  # fmt: skip
        del bufs
        # the decode access pattern without the math
        copies = rotation_copies(c, l2)
        cfg = launch_config(128, row.num_q_heads // row.num_kv_heads, torch.bfloat16)
        max_chunks = triton_splitk.grid_chunks(row.batch, row.num_kv_heads, sms)
        num_cand = triton_splitk.num_candidates(c.block_table.shape[1] * 16, cfg["BLOCK_N"])
        plan = triton_splitk.chunk_plan(row.seqlens, row.num_kv_heads, sms, max_chunks, cfg["BLOCK_N"], num_cand)
        chunk = max(e - s for _, s, e in plan)
        for mult in (1, 2, 4):
            size = chunk * mult
            chunks = [(b, s, min(s + size, L)) for b, L in enumerate(row.seqlens) for s in range(0, L, size)]
            ch = torch.tensor(chunks, dtype=torch.int32, device="cuda").T.contiguous()
            sink = torch.empty(len(chunks) * row.num_kv_heads, device="cuda")
            cit = itertools.cycle(copies)
            for bn, stages in ((cfg["BLOCK_N"], cfg["num_stages"]), (128, 2), (64, 4)):
                res[f"gather/{size}/bn{bn}s{stages}"] = graph_us(
                    lambda: gather(next(cit), ch, sink, row.num_kv_heads, bn, stages))
            # dots: the decode's tiles (128 tokens at 3 stages: one program per SM; 64 at 3, 32 at 3 and 4)
            for bn, stages in ((128, 3), (64, 3), (32, 3), (32, 4)) if dots else ():
                res[f"dots/{size}/bn{bn}s{stages}"] = graph_us(
                    lambda: gather(next(cit), ch, sink, row.num_kv_heads, bn, stages, dots=True))
        cit = itertools.cycle(copies)
        out = torch.empty_like(c.q)
        res["auto"] = graph_us(lambda: decode_attention(*next(cit).args, out=out))
        decode_plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
        res["plan"] = graph_us(lambda: decode_attention(*next(cit).args, out=out, plan=decode_plan))
        res["single"] = graph_us(
            lambda: decode_single(*next(cit).args, 128**-0.5, out, None)
        )
        rec = dict(row=row.name(), kv_mb=round(kv_bytes / 1e6, 1), chunk=chunk,
                   **{k: round(v, 2) for k, v in res.items()})  # fmt: skip
        best_read = min(v for k, v in res.items() if k.startswith(("read", "sum")))
        best_gather = min((v, k) for k, v in res.items() if k.startswith("gather"))
        if dots:
            best_dots = min((v, k) for k, v in res.items() if k.startswith("dots"))
            one_wave = min((v, k) for k, v in res.items() if k.startswith("dots") and k.endswith("bn128s3"))
            line = (f"{row.name():<16} {kv_bytes / 1e6:>7.1f} MB  gather {best_gather[0]:>6.1f} ({best_gather[1]})  "
                    f"dots {best_dots[0]:>6.1f} ({best_dots[1]}), 128-token tile {one_wave[0]:>6.1f} ({one_wave[1]})  "
                    f"plan {res['plan']:>6.1f}")  # fmt: skip
        else:
            line = (f"{row.name():<16} {kv_bytes / 1e6:>7.1f} MB  read {best_read:>6.1f} us "
                    f"({kv_bytes / best_read / 1e3:>5.0f} GB/s)  gather {best_gather[0]:>6.1f} "
                    f"({kv_bytes / best_gather[0] / 1e3:>5.0f} GB/s, {best_gather[1]})  auto {res['auto']:>6.1f}  "
                    f"plan {res['plan']:>6.1f} ({kv_bytes / res['plan'] / 1e3:>5.0f} GB/s)  "
                    f"single {res['single']:>6.1f}")  # fmt: skip
        log.row(rec, line)
    log.close()


if __name__ == "__main__":
    main()
