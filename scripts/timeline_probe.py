"""When each program of a decode kernel starts and ends: where the big rows' fixed ~8 us beyond bytes / bandwidth goes,
and whether dealing the last tokens out dynamically gets it back.

    python scripts/timeline_probe.py [ROW,...]    (GPU; writes $OUT/timeline.jsonl and $OUT/timeline-*.pt)
    TIMELINE_VARIANTS=static:1.0:0:-3,static:0.8:256:-3 TIMELINE_TILE=128,3 TIMELINE_MAXNREG=168 python ...

A timed copy of the partial kernel's work: program (slot, KV head) runs ``attend_group`` over fixed split
``slot % S`` of sequence ``slot // S`` (the fixed mode's tiles; S = 1 is the single pass) with the tile the library
launches for that mode, writes its (out, lse) partial, and records %globaltimer at its start and after its stores,
and its %smid. S and the tile come from ``plan_decode`` for the row. The partials are merged by the library's
combine kernel and checked against the float64 reference, so the timed work is the real work.

Variants (VARIANTS: kind, share of the tokens in big pieces, small piece tokens):
* ``static`` 1.0: the fixed splits as the library runs them (the baseline).
* ``static`` < 1 (earlier runs): big pieces first in the grid, then small pieces of the rest, for the block scheduler
  to deal to the SMs that finish first.
* ``queue``: persistent programs (as many as the static grid's big pieces, at most 3 or 4 a SM, held there by
  maxnreg); each runs its big piece, then claims the next piece from an atomic counter when it is free.

Per variant (eager calls, caches rotated out of L2, after a warm-up): the programs' end times as quantiles from the
first start, and graph times: the plan's own call, the timed kernel alone, the timed kernel plus the combine.
"""

import itertools
import os
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

sys.path.insert(0, "src")
from flashdecode import decode_attention, plan_decode, triton_splitk  # noqa: E402
from flashdecode.bench import ProbeLog, Row, _l2_bytes, rotation_copies  # noqa: E402
from flashdecode.cases import random_paged_case  # noqa: E402
from flashdecode.reference import reference_dense  # noqa: E402
from flashdecode.triton_common import LOG2E, attend_group, cdiv, dot_in_fp32, store_group  # noqa: E402
from flashdecode.triton_single import single_config  # noqa: E402

ROWS = {
    "64x4096-32/8": Row([4096] * 64, 32, 8), "128x8192-32/8": Row([8192] * 128, 32, 8),
    "256x2048-32/8": Row([2048] * 256, 32, 8), "1x131072-12/12": Row([131072], 12, 12),
    "1x65536-12/12": Row([65536], 12, 12), "16x4096-12/12": Row([4096] * 16, 12, 12),
    "1x131072-32/32": Row([131072], 32, 32), "256x256-12/2": Row([256] * 256, 12, 2),
    "16x4096-12/2": Row([4096] * 16, 12, 2), "8x2048-28/4": Row([2048] * 8, 28, 4),
}  # fmt: skip


@triton.jit
def _now(anchor):
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [anchor], dtype=tl.int64, is_pure=False,
                                     pack=1)  # fmt: skip


@triton.jit
def _record(TIMES, pid, t0):
    """Program pid's [start ns, end ns, SM] into TIMES [programs, 3]."""
    t1 = _now(pid)
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(TIMES + pid * 3, t0)
    tl.store(TIMES + pid * 3 + 1, t1)
    tl.store(TIMES + pid * 3 + 2, sm.to(tl.int64))


@triton.jit
def _piece(
    seq, head_prog, split, Q, K, V, SEQLENS, BLOCK_TABLE, O_PART, LSE_PART, qk_scale, num_q_heads,
    stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_btb, stride_btp,
    NUM_BIG: tl.constexpr, NUM_SMALL: tl.constexpr, BIG_PER_1024: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_F32: tl.constexpr,
    USE_DOT: tl.constexpr, HEAD_BLOCKS: tl.constexpr, PREFETCH_PAGES: tl.constexpr,
):  # fmt: skip
    # split < NUM_BIG: one of NUM_BIG splits of BIG_PER_1024 / 1024 of the sequence's tiles (all of them without small
    # pieces); else one of NUM_SMALL splits of the rest. Writes partial (sequence, split) of head block head_prog
    seq = seq.to(tl.int64)
    kv_head, head_block = head_prog // HEAD_BLOCKS, head_prog % HEAD_BLOCKS
    seqlen = tl.load(SEQLENS + seq)
    tiles = tl.cdiv(seqlen, BLOCK_N)
    if NUM_SMALL == 0:
        first, last = split * tiles // NUM_BIG, (split + 1) * tiles // NUM_BIG
    else:
        big = tiles * BIG_PER_1024 // 1024
        if split < NUM_BIG:
            first, last = split * big // NUM_BIG, (split + 1) * big // NUM_BIG
        else:
            first = big + (split - NUM_BIG) * (tiles - big) // NUM_SMALL
            last = big + (split - NUM_BIG + 1) * (tiles - big) // NUM_SMALL
    out, lse = attend_group(
        Q, K, V, BLOCK_TABLE + seq * stride_btb, seq, kv_head, head_block, seqlen, first * BLOCK_N,
        tl.minimum(last * BLOCK_N, seqlen), qk_scale,
        stride_qb, 0, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_btp,
        Q, Q, Q, 0.0, 0,
        GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_H, BLOCK_N, BLOCK_D, DOT_F32, USE_DOT,
        False, False, False, 1, False, False, PREFETCH_PAGES, False,
    )  # fmt: skip
    store_group(
        O_PART, LSE_PART, Q, seq * (NUM_BIG + NUM_SMALL) + split, kv_head, head_block, out, lse,
        num_q_heads * HEAD_DIM, 0, HEAD_DIM, num_q_heads, GROUP, HEAD_DIM, BLOCK_H, BLOCK_D, True, False, 1,
    )  # fmt: skip


@triton.jit
def _timed_kernel(
    Q, K, V, SEQLENS, BLOCK_TABLE, O_PART, LSE_PART, TIMES, qk_scale, num_q_heads, batch,
    stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_btb, stride_btp,
    NUM_BIG: tl.constexpr, NUM_SMALL: tl.constexpr, BIG_PER_1024: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_F32: tl.constexpr,
    USE_DOT: tl.constexpr, HEAD_BLOCKS: tl.constexpr, PREFETCH_PAGES: tl.constexpr, HEADS_FIRST: tl.constexpr,
):  # fmt: skip
    t0 = _now(tl.program_id(0))
    if HEADS_FIRST:
        head_prog, slot = tl.program_id(0), tl.program_id(1)
    else:
        slot, head_prog = tl.program_id(0), tl.program_id(1)
    # big pieces first (slots [0, B * NUM_BIG): BIG_PER_1024 / 1024 of each sequence's tiles in NUM_BIG splits), then
    # the small ones (the rest of the tiles in NUM_SMALL splits), which the block scheduler deals to the SMs that
    # finish their big pieces first
    if NUM_SMALL == 0:
        seq, split = slot // NUM_BIG, slot % NUM_BIG
    elif slot < batch * NUM_BIG:
        seq, split = slot // NUM_BIG, slot % NUM_BIG
    else:
        seq = (slot - batch * NUM_BIG) // NUM_SMALL
        split = NUM_BIG + (slot - batch * NUM_BIG) % NUM_SMALL
    _piece(
        seq, head_prog, split, Q, K, V, SEQLENS, BLOCK_TABLE, O_PART, LSE_PART, qk_scale, num_q_heads,
        stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_btb, stride_btp,
        NUM_BIG, NUM_SMALL, BIG_PER_1024, GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_H, BLOCK_N, BLOCK_D, DOT_F32, USE_DOT,
        HEAD_BLOCKS, PREFETCH_PAGES,
    )  # fmt: skip
    _record(TIMES, tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), t0)


@triton.jit
def _queue_kernel(
    Q, K, V, SEQLENS, BLOCK_TABLE, O_PART, LSE_PART, TIMES, COUNTER, qk_scale, num_q_heads, heads, n_items, n_big,
    n_total,
    stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_btb, stride_btp,
    NUM_BIG: tl.constexpr, NUM_SMALL: tl.constexpr, BIG_PER_1024: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_F32: tl.constexpr,
    USE_DOT: tl.constexpr, HEAD_BLOCKS: tl.constexpr, PREFETCH_PAGES: tl.constexpr,
):  # fmt: skip
    # persistent programs: piece pid first (as the static grid would run it), then each program claims the next
    # pieces from COUNTER; the programs that finish first take the small pieces
    t0 = _now(tl.program_id(0))
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    j = pid
    while j < n_total:
        # piece j: item = (sequence, KV head, head block) fastest; the big pieces [0, n_big), then the small ones
        if j < n_big:
            item, split = j % n_items, j // n_items
        else:
            item, split = (j - n_big) % n_items, NUM_BIG + (j - n_big) // n_items
        _piece(
            item // heads, item % heads, split, Q, K, V, SEQLENS, BLOCK_TABLE, O_PART, LSE_PART, qk_scale,
            num_q_heads, stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
            stride_btb, stride_btp, NUM_BIG, NUM_SMALL, BIG_PER_1024, GROUP, HEAD_DIM, PAGE_SIZE, BLOCK_H, BLOCK_N,
            BLOCK_D, DOT_F32, USE_DOT, HEAD_BLOCKS, PREFETCH_PAGES,
        )  # fmt: skip
        # claimed when this program is free, not before: the programs that finish first take the next pieces
        j = tl.atomic_add(COUNTER, 1) + programs
    # the last program to leave resets the counter for the next call (every claim precedes its program's arrival)
    if tl.atomic_add(COUNTER + 1, 1) == programs - 1:
        tl.store(COUNTER, 0)
        tl.store(COUNTER + 1, 0)
    _record(TIMES, pid, t0)


def tile_for(row, splits, sms):
    """The launch config the library uses for this row in this mode (single pass or fixed splits)."""
    group = row.num_q_heads // row.num_kv_heads
    if splits == 1:
        return single_config(128, group, torch.bfloat16, 1, 2, row.batch * row.num_kv_heads, sms), False
    cfg, _, tile = triton_splitk.split_config(128, group, torch.bfloat16, 1, 2, row.num_kv_heads, False)
    return cfg, tile in triton_splitk.PARTIAL_HEADS_FIRST and triton_splitk.FIXED_HEADS_FIRST


def layout_for(row, splits, cfg, big_frac, small_tokens, heads_first):
    """(NUM_BIG, NUM_SMALL, BIG_PER_1024, heads first): big_frac 1 is the fixed splits as the library cuts them
    (splits the plan's S, or the variant's own count of big pieces)."""
    if big_frac >= 1:
        return splits, 0, 1024, heads_first
    per_1024 = int(big_frac * 1024)
    tiles = cdiv(max(row.seqlens), cfg["BLOCK_N"])
    rest = tiles - tiles * per_1024 // 1024
    return splits, max(1, cdiv(rest * cfg["BLOCK_N"], small_tokens)), per_1024, True


def run_timed(x, layout, cfg, o_part, lse_part, times, maxnreg=None):
    q, k, v, lens, table = x.args
    num_big, num_small, per_1024, heads_first = layout
    group = q.shape[1] // k.shape[2]
    head_blocks = cdiv(group, cfg["BLOCK_H"])
    slots, heads = lens.shape[0] * (num_big + num_small), k.shape[2] * head_blocks
    grid = (heads, slots) if heads_first else (slots, heads)
    return _timed_kernel[grid](
        q, k, v, lens, table, o_part, lse_part, times, 128**-0.5 * LOG2E, q.shape[1], lens.shape[0],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        table.stride(0), table.stride(1),
        NUM_BIG=num_big, NUM_SMALL=num_small, BIG_PER_1024=per_1024, GROUP=group, HEAD_DIM=128, PAGE_SIZE=k.shape[1],
        HEAD_BLOCKS=head_blocks, DOT_F32=dot_in_fp32(q.dtype), HEADS_FIRST=heads_first, **cfg,
        **({"maxnreg": maxnreg} if maxnreg else {}),
    )  # fmt: skip


def run_queue(x, layout, cfg, o_part, lse_part, times, counter, programs, maxnreg=None):
    q, k, v, lens, table = x.args
    num_big, num_small, per_1024, _ = layout
    group = q.shape[1] // k.shape[2]
    head_blocks = cdiv(group, cfg["BLOCK_H"])
    heads = k.shape[2] * head_blocks
    n_items = lens.shape[0] * heads
    return _queue_kernel[(programs,)](
        q, k, v, lens, table, o_part, lse_part, times, counter, 128**-0.5 * LOG2E, q.shape[1], heads, n_items,
        n_items * num_big, n_items * (num_big + num_small),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        table.stride(0), table.stride(1),
        NUM_BIG=num_big, NUM_SMALL=num_small, BIG_PER_1024=per_1024, GROUP=group, HEAD_DIM=128, PAGE_SIZE=k.shape[1],
        HEAD_BLOCKS=head_blocks, DOT_F32=dot_in_fp32(q.dtype), **cfg, **({"maxnreg": maxnreg} if maxnreg else {}),
    )  # fmt: skip


def summarise(times, sms):
    """Quantiles (us from the first start) of one call's [programs, 3] (start ns, end ns, smid) record."""
    t0 = times[:, 0].min()
    start, end, sm = (times[:, 0] - t0) / 1e3, (times[:, 1] - t0) / 1e3, times[:, 2]
    q = torch.quantile(end.double(), torch.tensor([0.01, 0.1, 0.5, 0.9, 1.0], dtype=torch.float64))
    per_sm = torch.bincount(sm.long(), minlength=sms)
    last_end = torch.zeros(sms, dtype=torch.float64).scatter_reduce(0, sm.long(), end.double(), "amax")
    used = per_sm > 0
    by_load = {int(n): round(float(last_end[per_sm == n].mean()), 1) for n in per_sm[used].unique().tolist()}
    return dict(
        span=round(float(end.max()), 1), last_start=round(float(start.max()), 1),
        end_q=[round(float(v), 1) for v in q], tail=round(float(q[4] - q[3]), 1),
        mean_run=round(float((end - start).mean()), 1), sms_used=int(used.sum()), end_by_load=by_load,
    )  # fmt: skip


VARIANTS = [("static", 1.0, 0, 0), ("queue", 1.0, 0, 0), ("queue", 0.8, 256, 0), ("queue", 0.8, 512, 0),
            ("queue", 0.9, 256, 0), ("queue", 0.9, 512, 0)]  # fmt: skip


def variants():
    """VARIANTS, or TIMELINE_VARIANTS="kind:frac:small:big,...". big 0: the plan's S big pieces a sequence; big -N:
    as many as fill N resident programs on every SM (N * #SMs programs of big pieces, when that divides evenly), the
    small pieces then dealt by the block scheduler to the slots that free first."""
    spec = os.environ.get("TIMELINE_VARIANTS")
    if not spec:
        return VARIANTS
    return [(k, float(f), int(n), int(b)) for k, f, n, b in (v.split(":") for v in spec.split(","))]


def tile_override(cfg):
    """TIMELINE_TILE="BLOCK_N,stages[,p]" (p: the page-id prefetch) in place of the library's tile."""
    spec = os.environ.get("TIMELINE_TILE")
    if not spec:
        return cfg
    parts = spec.split(",")
    return dict(cfg, BLOCK_N=int(parts[0]), num_stages=int(parts[1]), PREFETCH_PAGES=parts[2:] == ["p"])


def main():
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(ROWS)
    out_dir = os.environ.get("OUT", ".")
    log = ProbeLog("timeline")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    l2 = _l2_bytes("cuda")
    for name in names:
        row = ROWS[name]
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, 128, 16, torch.bfloat16, "cuda",
                              spare_pages=0)  # fmt: skip
        plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
        if plan.num_splits is None:
            print(f"{name}: the plan is device-planned ({plan.reason}); skipped", flush=True)
            continue
        splits = plan.num_splits
        cfg, heads_first = tile_for(row, splits, sms)
        cfg = tile_override(cfg)
        copies = rotation_copies(c, l2)
        it = itertools.cycle(copies)
        out = torch.empty_like(c.q)
        plan_us = do_bench_cudagraph(lambda: decode_attention(*next(it).args, out=out, plan=plan), rep=30) * 1e3
        ref = None
        if row.kv_bytes() < 2.5e9:
            ref, _ = reference_dense(*c.args, 128**-0.5, device="cuda")
        group = row.num_q_heads // row.num_kv_heads
        heads = row.num_kv_heads * cdiv(group, cfg["BLOCK_H"])
        saved = {}
        for kind, frac, small, big in variants():
            num_big = splits if big == 0 else -big * sms // heads // row.batch
            if num_big * heads * row.batch != (splits * heads * row.batch if big == 0 else -big * sms):
                print(f"{name}: {-big} programs a SM do not divide into {row.batch * heads} items; skipped")
                continue
            layout = layout_for(row, num_big, cfg, frac, small, heads_first)
            total = layout[0] + layout[1]
            slots = row.batch * total
            per_sm = 3 if (cfg["BLOCK_N"], cfg["num_stages"]) == (128, 2) else 4
            programs = min(row.batch * heads * layout[0], sms * per_sm) if kind == "queue" else slots * heads
            counter = torch.zeros(2, dtype=torch.int32, device="cuda")
            # the queue kernel held to the static one's programs per SM (3 for the MHA tile, else 4)
            maxnreg = 168 if per_sm == 3 else 128

            def run(x):
                if kind == "queue":
                    return run_queue(x, layout, cfg, o_part, lse_part, times, counter, programs, maxnreg)
                # TIMELINE_MAXNREG: hold the static kernel to the programs per SM of the plain fixed splits
                return run_timed(x, layout, cfg, o_part, lse_part, times, int(os.environ.get("TIMELINE_MAXNREG", 0)))
            o_part = torch.empty(slots, row.num_q_heads, 128, device="cuda")
            lse_part = torch.empty(slots, row.num_q_heads, device="cuda")
            times = torch.zeros(programs, 3, dtype=torch.int64, device="cuda")
            dummy_plan = torch.zeros(1, dtype=torch.int32, device="cuda")

            def call(x):
                compiled = run(x)
                if total > 1:
                    triton_splitk.launch_combine(o_part, lse_part, out, None, dummy_plan, slots, total, num_sms=sms)
                else:
                    out.copy_(o_part.view_as(out))
                return compiled

            # correctness of the timed work, merged by the library's combine, against the float64 reference
            o_part.fill_(float("nan"))
            out.fill_(float("nan"))
            regs = call(c).n_regs
            if ref is not None:
                err = float((out.double() - ref).abs().max())
                assert err < 2e-2, f"{name} {kind} {frac} {small}: off the reference by {err}"
            for _ in range(3):
                call(next(it))
            runs = []
            for _ in range(5):
                run(next(it))
                torch.cuda.synchronize()
                runs.append(times.cpu().clone())
            saved[(kind, frac, small, big)] = dict(layout=layout, cfg=cfg, runs=runs)
            timed_us = do_bench_cudagraph(lambda: run(next(it)), rep=30) * 1e3
            merged_us = do_bench_cudagraph(lambda: call(next(it)), rep=30) * 1e3
            stats = [summarise(r, sms) for r in runs]
            rec = dict(kind=kind, row=name, kv_mb=round(row.kv_bytes() / 1e6, 1), splits=splits, layout=layout,
                       programs=programs, regs=regs, BLOCK_N=cfg["BLOCK_N"], plan_us=round(plan_us, 1),
                       timed_us=round(timed_us, 1), merged_us=round(merged_us, 1), runs=stats)  # fmt: skip
            med = sorted(stats, key=lambda s: s["span"])[len(stats) // 2]
            line = (f"{name:<15} {kind:<6} big {layout[0]:<3} x {frac:<4} small {layout[1]:<4} ({small:>3} tok) "
                    f"{programs:>6} progs {regs} regs  plan {plan_us:6.1f}  timed {timed_us:6.1f}  "
                    f"+combine {merged_us:6.1f}  span {med['span']:6.1f}  last start {med['last_start']:5.1f}  "
                    f"ends {med['end_q']}  by load {med['end_by_load']}")  # fmt: skip
            log.row(rec, line)
        torch.save(saved, os.path.join(out_dir, f"timeline-{name.replace('/', '-')}.pt"))
        c = copies = it = ref = None  # free this row's caches
        torch.cuda.empty_cache()
    log.close()


if __name__ == "__main__":
    main()
