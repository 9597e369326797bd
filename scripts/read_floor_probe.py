"""The fastest read of N bytes this GPU gives a CUDA-graph-timed kernel: the floor under the 12/2 rows' 19 us target.

ceiling_probe.py's contiguous read (a loop of 16 KB loads a program) took 20.7 us for the 12/2 rows' 67.1 MB, slower
than its page gather (19.0-19.5), so it did not bound what a read can do. Here contiguous buffers of 33.6, 67.1 and
134.2 MB, rotated through >= 3x L2, are read by kernels written only to stream:

* ``flat/E/wW`` — one program per E bf16 elements, all loaded by one ``tl.load`` (E / 32 / W 16-byte loads a thread
  in flight); the hardware deals the programs out as slots free.
* ``flat/E/wW/cg`` — the same with ``cache_modifier=".cg"`` (L2 only).
* ``loop/P/E/uU`` — P programs (a multiple of the SM count), each walking the tiles pid, pid + P, ... with U tiles of
  E elements loaded before any is summed.
* ``block/P/E/uU`` — the same P programs each owning one contiguous region (the decode's static grid), U
  neighbouring tiles a step.
* ``tma/P/R`` — P programs loading [R, 128] boxes of a 2-D view through a tensor descriptor, Triton-pipelined.

and, in the same process, the 12/2 rows' page gather (ceiling_probe's best: 128-token tiles, 2 stages, chunk 512) and
the plan's decode. Per variant family the best time at each size, and the line through the three sizes (slope: the
streaming rate, intercept: the fixed cost a call pays whatever it reads).

    python scripts/read_floor_probe.py      # on the GPU machine; writes $OUT/read_floor.jsonl, a table last
"""

import itertools

import torch
import triton
import triton.language as tl
from ceiling_probe import _empty_kernel, gather, graph_us
from triton.tools.tensor_descriptor import TensorDescriptor

from flashdecode import decode_attention, plan_decode
from flashdecode.bench import ProbeLog, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case

MB = 1 << 20
SIZES = [32 * MB, 64 * MB, 128 * MB]  # bytes: 8 x 2048 28/4's, the 12/2 rows' and 1 x 131072 12/2's K+V


@triton.jit
def _flat_kernel(X, OUT, E: tl.constexpr, CG: tl.constexpr):
    # program p sums X[p * E : (p + 1) * E] (n is a multiple of E): one load, E / (32 * warps) elements a thread
    p = tl.program_id(0)
    offs = p.to(tl.int64) * E + tl.arange(0, E)
    if CG:
        x = tl.load(X + offs, cache_modifier=".cg")
    else:
        x = tl.load(X + offs)
    tl.store(OUT + p, tl.sum(x.to(tl.float32), axis=0))


@triton.jit
def _tile(X, t, n_tiles, E: tl.constexpr):
    offs = t * E + tl.arange(0, E)  # < 2^31: the buffers hold 64M elements at most
    return tl.load(X + offs, mask=t < n_tiles, other=0.0).to(tl.float32)


@triton.jit
def _loop_kernel(X, OUT, n_tiles, E: tl.constexpr, U: tl.constexpr):
    # grid-stride over tiles of E elements: tiles i, i + P, ... i + (U - 1) * P loaded before any is summed
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    acc = tl.zeros([E], tl.float32)
    for i in range(pid, n_tiles, P * U):
        if U == 1:
            acc += _tile(X, i, n_tiles, E)
        elif U == 2:
            a = _tile(X, i, n_tiles, E)
            b = _tile(X, i + P, n_tiles, E)
            acc += a + b
        else:
            a = _tile(X, i, n_tiles, E)
            b = _tile(X, i + P, n_tiles, E)
            c = _tile(X, i + 2 * P, n_tiles, E)
            d = _tile(X, i + 3 * P, n_tiles, E)
            acc += (a + b) + (c + d)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


@triton.jit
def _block_kernel(X, OUT, n_tiles, per, E: tl.constexpr, U: tl.constexpr):
    # blocked: program pid reads tiles [pid * per, (pid + 1) * per), U neighbouring tiles a step (the decode's static
    # grid, where a program owns one region of the cache)
    pid = tl.program_id(0)
    acc = tl.zeros([E], tl.float32)
    for i in range(pid * per, pid * per + per, U):
        if U == 1:
            acc += _tile(X, i, n_tiles, E)
        elif U == 2:
            acc += _tile(X, i, n_tiles, E) + _tile(X, i + 1, n_tiles, E)
        else:
            a = _tile(X, i, n_tiles, E)
            b = _tile(X, i + 1, n_tiles, E)
            c = _tile(X, i + 2, n_tiles, E)
            d = _tile(X, i + 3, n_tiles, E)
            acc += (a + b) + (c + d)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


@triton.jit
def _tma_kernel(DESC, OUT, n_boxes, R: tl.constexpr):
    # grid-stride over [R, 128] boxes of the [n / 128, 128] view; Triton pipelines the descriptor loads
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    acc = tl.zeros([R, 128], tl.float32)
    for b in range(pid, n_boxes, P):
        acc += DESC.load([b * R, 0]).to(tl.float32)
    tl.store(OUT + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


def _fit(points):
    """Least-squares line through (bytes, us): (GB/s of the slope, intercept us)."""
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    slope = sum((b - mx) * (t - my) for b, t in points) / sum((b - mx) ** 2 for b, _ in points)
    return 1e-3 / slope, my - slope * mx


def main():
    log = ProbeLog("read_floor")
    l2 = _l2_bytes("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    dummy = torch.zeros(1, device="cuda")
    launch = graph_us(lambda: _empty_kernel[(1,)](dummy))
    log.row(dict(what="launch", us=round(launch, 2), l2_mb=l2 / MB, sms=sms),
            f"empty kernel {launch:.2f} us; L2 {l2 / MB:.0f} MB; {sms} SMs")  # fmt: skip
    best = {}  # family -> {bytes: (us, variant)}
    for size in SIZES:
        n = size // 2
        bufs = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, -(-3 * l2 // size)))]
        it = itertools.cycle(bufs)
        res = {}
        sink = torch.empty(n // 1024, device="cuda")
        for e, w in ((2048, 4), (4096, 4), (8192, 4), (8192, 8), (16384, 8), (32768, 16)):
            for cg in (False, True):
                name = f"flat/{e}/w{w}" + ("/cg" if cg else "")
                res[name] = graph_us(lambda: _flat_kernel[(n // e,)](next(it), sink, E=e, CG=cg, num_warps=w))
        for mult, e, u in itertools.product((2, 4, 8), (2048, 4096), (1, 2, 4)):
            name = f"loop/{mult * sms}/{e}/u{u}"
            res[name] = graph_us(lambda: _loop_kernel[(mult * sms,)](next(it), sink, n // e, E=e, U=u, num_warps=4))
        for mult, e, u in itertools.product((2, 4, 8), (2048, 4096), (1, 2, 4)):
            progs = mult * sms
            per = -(-(n // e) // progs)
            per = -(-per // u) * u
            name = f"block/{progs}/{e}/u{u}"
            res[name] = graph_us(lambda: _block_kernel[(progs,)](next(it), sink, n // e, per, E=e, U=u, num_warps=4))
        descs = {}
        for r in (64, 128):
            descs[r] = [TensorDescriptor(b.view(-1, 128), [n // 128, 128], [128, 1], [r, 128]) for b in bufs]
            for mult, stages in itertools.product((1, 2, 4), (2, 3, 4)):
                dit = itertools.cycle(descs[r])
                name = f"tma/{mult * sms}/{r}/s{stages}"
                res[name] = graph_us(lambda: _tma_kernel[(mult * sms,)](next(dit), sink, n // 128 // r, R=r,
                                                                         num_warps=4, num_stages=stages))  # fmt: skip
        bufs = descs = it = dit = None  # the cycles hold the buffers too
        rec = dict(mb=size / MB, **{k: round(v, 2) for k, v in res.items()})
        for fam in ("flat", "loop", "block", "tma"):
            v, k = min((v, k) for k, v in res.items() if k.startswith(fam))
            best.setdefault(fam, {})[size] = (v, k)
        summary = "  ".join(f"{fam} {best[fam][size][0]:6.2f} ({best[fam][size][1]})" for fam in best)
        log.row(rec, f"{size / MB:5.0f} MiB  {summary}")
    for fam, by_size in best.items():
        rate, icpt = _fit([(b, v[0]) for b, v in by_size.items()])
        log.row(dict(fit=fam, gbps=round(rate), intercept_us=round(icpt, 2)),
                f"{fam:>5}: slope {rate:5.0f} GB/s, intercept {icpt:5.2f} us")
    # the 12/2 rows' decode pattern in the same process: 67.1 MB through a random page table
    for seqlens in ([256] * 256, [1024] * 64, [65536]):
        c = random_paged_case(seqlens, 12, 2, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
        copies = rotation_copies(c, l2)
        chunks = [(b, s, min(s + 512, L)) for b, L in enumerate(seqlens) for s in range(0, L, 512)]
        ch = torch.tensor(chunks, dtype=torch.int32, device="cuda").T.contiguous()
        gsink = torch.empty(len(chunks) * 2, device="cuda")
        cit = itertools.cycle(copies)
        g = graph_us(lambda: gather(next(cit), ch, gsink, 2, 128, 2))
        out = torch.empty_like(c.q)
        plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
        p = graph_us(lambda: decode_attention(*next(cit).args, out=out, plan=plan))
        name = f"{len(seqlens)}x{seqlens[0]} 12/2"
        log.row(dict(row=name, gather=round(g, 2), plan=round(p, 2)),
                f"{name:<14} 64 MiB  page gather {g:6.2f} us  plan {p:6.2f} us")
        del copies
    log.close()


if __name__ == "__main__":
    main()
