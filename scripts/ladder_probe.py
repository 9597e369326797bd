"""Where the single pass's 1.1-1.7 us over its bare pipelined products go, on the 12/2 single-pass rows: one kernel
rebuilt from gather_floor_probe's ``pdots`` (a program per sequence and KV head, 32-token tiles, the two products
pipelined through shared memory) one decode feature at a time, each step timed beside the library's single pass.

    STEP 0  the products, page ids loaded in the loop (``pdots`` through the table)
    STEP 1  + the page ids one tile ahead in registers (the library's PREFETCH_PAGES)
    STEP 2  + the length read from cache_seqlens and every load and score masked by it
    STEP 3  + the online softmax (running row max across the warps, exp2, rescale; q read from memory)
    STEP 4  + the epilogue: out = acc / l and the LSE stored (checked against the float64 reference)

and the products with the page ids a tile ahead, two tiles ahead, or one id a page (a [tiles' pages] load, offsets
broadcast), each on 32-token tiles at 3 and 4 stages and 64-token tiles at 3 (ladder-7fd18b9: two ahead 17.94 us on
the 64-token tile, one ahead 20.06 there and 18.31 on the 32-token tile; in the library it lost, docs/design.md).

    python scripts/ladder_probe.py    # on the GPU machine; writes $OUT/ladder.jsonl, a table last
"""

import itertools
import math

import torch
import triton
import triton.language as tl
from ceiling_probe import graph_us

from flashdecode import decode_attention, plan_decode
from flashdecode.bench import ProbeLog, probe_case
from flashdecode.triton_common import softmax_step

STEPS = ("products", "+ page ids ahead", "+ length, masks", "+ online softmax", "+ epilogue")


@triton.jit
def _ladder_kernel(
    Q, K, V, TABLE, LENS, OUT, LSE, SINK, seq_len, qk_scale, stride_kp, stride_kt, stride_kh, stride_bt,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr, HQ: tl.constexpr,
    STEP: tl.constexpr, IDS: tl.constexpr,
):  # fmt: skip
    # program (b, h): sequence b, KV head h; query rows h * GROUP + [0, 16) padded to one 16-row tl.dot tile
    b = tl.program_id(0)
    h = tl.program_id(1)
    row = TABLE + b.to(tl.int64) * stride_bt
    if STEP >= 2:
        end = tl.load(LENS + b)
    else:
        end = seq_len
    offs_h = tl.arange(0, 16)
    offs_d = tl.arange(0, D)
    mask_h = offs_h < GROUP
    q_rows = b.to(tl.int64) * HQ + h * GROUP + offs_h
    if STEP >= 3:
        q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=mask_h[:, None], other=0.0)
    else:
        q = (tl.zeros([16, D], tl.float32) + 1.0).to(K.dtype.element_ty)
    m_i = tl.full([16], float("-inf"), tl.float32)
    l_i = tl.zeros([16], tl.float32)
    acc = tl.zeros([16, D], tl.float32)
    base = h.to(tl.int64) * stride_kh
    offs_b = tl.arange(0, BLOCK_N)
    NP: tl.constexpr = BLOCK_N // PAGE_SIZE
    if IDS == 1:
        next_pages = tl.load(row + offs_b // PAGE_SIZE, mask=offs_b < end, other=0)
    elif IDS == 2:
        next_pages = tl.load(row + offs_b // PAGE_SIZE, mask=offs_b < end, other=0)
        next_pages2 = tl.load(row + (offs_b + BLOCK_N) // PAGE_SIZE, mask=offs_b + BLOCK_N < end, other=0)
    elif IDS == 3:
        next_ids = tl.load(row + tl.arange(0, NP), mask=tl.arange(0, NP) * PAGE_SIZE < end, other=0)
    for t in range(0, end, BLOCK_N):
        offs_n = t + offs_b
        if IDS == 1:
            page = next_pages
            offs_next = offs_n + BLOCK_N
            next_pages = tl.load(row + offs_next // PAGE_SIZE, mask=offs_next < end, other=0)
        elif IDS == 2:
            page = next_pages
            next_pages = next_pages2
            offs_next = offs_n + 2 * BLOCK_N
            next_pages2 = tl.load(row + offs_next // PAGE_SIZE, mask=offs_next < end, other=0)
        elif IDS == 3:
            ids = next_ids
            nxt = (t + BLOCK_N) // PAGE_SIZE + tl.arange(0, NP)
            next_ids = tl.load(row + nxt, mask=nxt * PAGE_SIZE < end, other=0)
        else:
            page = tl.load(row + offs_n // PAGE_SIZE)
        if IDS == 3:
            # one id a page: [NP, PAGE_SIZE] row offsets flattened to the tile's tokens
            rows2 = ids.to(tl.int64)[:, None] * stride_kp + tl.arange(0, PAGE_SIZE)[None, :] * stride_kt
            off = base + tl.reshape(rows2, [BLOCK_N])[:, None]
        else:
            off = base + page.to(tl.int64)[:, None] * stride_kp + (offs_n % PAGE_SIZE)[:, None] * stride_kt
        off += offs_d[None, :]
        mask_n = offs_n < end
        if STEP >= 2:
            k = tl.load(K + off, mask=mask_n[:, None], other=0.0)
            v = tl.load(V + off, mask=mask_n[:, None], other=0.0)
        else:
            k = tl.load(K + off)
            v = tl.load(V + off)
        s = tl.dot(q, tl.trans(k))
        if STEP >= 3:
            s = tl.where(mask_n[None, :], s * qk_scale, float("-inf"))
            m_new, alpha, p, l_i = softmax_step(m_i, l_i, s)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        else:
            if STEP == 2:
                s = tl.where(mask_n[None, :], s, 0.0)
            acc += tl.dot(s.to(v.dtype), v)
    if STEP >= 4:
        # a sequence of length 0 gives out = 0, lse = -inf (l_i = 0)
        safe_l = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / safe_l[:, None]
        tl.store(OUT + q_rows[:, None] * D + offs_d[None, :], out.to(OUT.dtype.element_ty), mask=mask_h[:, None])
        lse = tl.where(l_i > 0.0, (m_i + tl.log2(safe_l)) * 0.6931471805599453, float("-inf"))
        tl.store(LSE + q_rows, lse, mask=mask_h)
    else:
        tl.store(SINK + b * tl.num_programs(1) + h, tl.sum(tl.sum(acc, axis=1), axis=0) + tl.sum(l_i, axis=0))


def ladder(x, seq_len, step, out, lse, sink, block_n=32, stages=3, ids=None):
    """Run step `step` of the ladder over case x (one query token, page 16, every sequence seq_len tokens long).
    ids: how the page ids arrive (default: in the loop at step 0, a tile ahead from step 1 on); 2, two tiles ahead;
    3, one id a page a tile ahead (no masks: steps 0-1 only)."""
    if ids is None:
        ids = 1 if step >= 1 else 0
    batch, hq, d = x.q.shape
    hkv = x.k_cache.shape[2]
    kp, kt, kh, _ = x.k_cache.stride()
    _ladder_kernel[(batch, hkv)](
        x.q, x.k_cache, x.v_cache, x.block_table, x.cache_seqlens, out, lse, sink, seq_len, d**-0.5 * math.log2(math.e),
        kp, kt, kh, x.block_table.stride(0),
        PAGE_SIZE=x.k_cache.shape[1], BLOCK_N=block_n, D=d, GROUP=hq // hkv, HQ=hq, STEP=step, IDS=ids, num_warps=4,
        num_stages=stages,
    )  # fmt: skip


def main():
    log = ProbeLog("ladder")
    for seqlens in ([256] * 256,):  # 64 x 1024's 128 programs: not comparable (ladder-52d6e67)
        case, ref, copies = probe_case(seqlens, 12, 2)
        name = f"{len(seqlens)}x{seqlens[0]} 12/2"
        out = torch.empty_like(case.q)
        lse = torch.empty(case.q.shape[:2], device="cuda", dtype=torch.float32)
        sink = torch.empty(len(seqlens) * 2, device="cuda")
        ladder(case, seqlens[0], 4, out, lse, sink)
        err = (out.double() - ref).abs().max().item()
        res = {}
        cit = itertools.cycle(copies)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        lib_out = torch.empty_like(case.q)
        res["library"] = graph_us(lambda: decode_attention(*next(cit).args, out=lib_out, plan=plan))
        for step, (bn, stages) in itertools.product(range(5), ((32, 3), (32, 4))):
            cit = itertools.cycle(copies)
            res[f"step{step}/bn{bn}s{stages}"] = graph_us(lambda: ladder(next(cit), seqlens[0], step, out, lse, sink, bn, stages))
        # one tile ahead (the library's) on every tile too: ladder-01051e4 timed two ahead on the 64-token tile alone
        for ids, (bn, stages) in itertools.product((1, 2, 3), ((32, 3), (32, 4), (64, 3))):
            cit = itertools.cycle(copies)
            res[f"ids{ids}/bn{bn}s{stages}"] = graph_us(
                lambda: ladder(next(cit), seqlens[0], 1, out, lse, sink, bn, stages, ids))
        res["library again"] = graph_us(lambda: decode_attention(*next(cit).args, out=lib_out, plan=plan))
        log.record(dict(row=name, max_abs_err_step4=err, **{k: round(v, 2) for k, v in res.items()}))
        log.line(f"{name}: step 4's out against float64: max abs error {err:.2e}")
        for step in range(5):
            v, k = min((v, k) for k, v in res.items() if k.startswith(f"step{step}/"))
            log.line(f"{name:<14} {STEPS[step]:<20} {v:6.2f} us ({k})")
        for ids, what in ((1, "ids a tile ahead"), (2, "ids two tiles ahead"), (3, "one id a page")):
            v, k = min((v, k) for k, v in res.items() if k.startswith(f"ids{ids}/"))
            log.line(f"{name:<14} {'products, ' + what:<20} {v:6.2f} us ({k})")
        log.line(f"{name:<14} {'library (plan)':<20} {res['library']:6.2f} / {res['library again']:6.2f} us")
    log.close()


if __name__ == "__main__":
    main()
