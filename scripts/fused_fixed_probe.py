"""Fixed splits with the merge in the last split program (``decode_splitk(counters=...)``) against fixed splits with
the combine launch, on the rows where ``plan_decode`` picks fixed splits (graph µs, caches rotated out of L2).

Each variant is checked against the float64 reference before and after its timing (the graph replays it hundreds of
times with the same counters, which the merging programs must leave at zero), and the counters are checked to be
zero. Run on the GPU machine:

    python scripts/fused_fixed_probe.py > fused_fixed.log

``--row 8,2048,28,4`` (repeatable) times those rows instead; ``--rows 64x1024,16x4096`` keeps the rows whose name
starts so; ``--timing-only`` prints each variant's error instead of asserting it (for source variants that skip work
on purpose, to see what that work costs). A row whose plan is the single pass times the single pass.
``--splits 32,33,44`` times those split counts instead of the plan's S, half and double; ``--tile 64,3`` (repeatable)
times fixed splits with that partial tile (BLOCK_N, stages[, warps][, p: the page ids a tile ahead]) too, as ``decode_splitk(config=...)`` takes it,
merged as the plan would merge them (``--tile-both``: with the combine launch and in the last split program).
``--plan-only`` times the plan's S alone. ``--no-combine`` also times each combine-launched variant with the calls
unchained (``CHAIN_PDL`` off), with and without its combine launch (timing only: the output is not merged), to see
what the combine costs.
"""

import argparse
import itertools
from unittest.mock import patch

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, plan_decode, triton_common, triton_splitk
from flashdecode.bench import probe_case
from flashdecode.check import max_err
from flashdecode.api import _num_sms
from flashdecode.triton_splitk import FIXED_MERGE_MAX_SPLITS, decode_splitk, merge_fixed_in_partial

# (lengths, Hq, Hkv)
ROWS = [
    ([2048] * 8, 28, 4), ([2048], 28, 4), ([1024] * 24, 28, 4), ([4096] * 16, 12, 2), ([16384] * 4, 12, 2),
    ([1024] * 64, 12, 2), ([16384] * 4, 12, 12), ([4096] * 16, 12, 12), ([65536], 12, 12), ([8192], 32, 32),
    ([32768], 32, 32), ([65536], 12, 2),
]  # fmt: skip


ROWS += [([256] * 256, 12, 2), ([256] * 64, 12, 12), ([131072], 12, 2), ([131072], 12, 12)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="", help="comma-separated prefixes of the row names to keep (e.g. 64x1024)")
    ap.add_argument("--row", action="append", default=[], help="B,S,Hq,Hkv: a uniform row of its own (repeatable)")
    ap.add_argument("--timing-only", action="store_true", help="print errors instead of asserting them")
    ap.add_argument("--splits", default="", help="comma-separated split counts to time (default: plan S, half, double)")
    ap.add_argument("--tile", action="append", default=[],
                    help="BLOCK_N,stages[,warps][,p]: a partial tile to time too (p: PREFETCH_PAGES)")
    ap.add_argument("--plan-only", action="store_true", help="time the plan's S only (no half and double)")
    ap.add_argument("--tile-both", action="store_true", help="time each --tile both merged ways, not as the plan would")
    ap.add_argument("--no-combine", action="store_true", help="also time the partial kernel alone (wrong output)")
    ap.add_argument("--combine-wide", action="append", default=[],
                    help="BLOCK_S,D_BLOCKS: also time each combine-launched S with this COMBINE_WIDE shape")
    args = ap.parse_args()
    keep = [r for r in args.rows.split(",") if r]
    sms = _num_sms(torch.device("cuda"))
    print(f"{'row':>16} {'variant':>12} {'µs':>7}")
    rows = [([s] * b, hq, hkv) for b, s, hq, hkv in (map(int, r.split(",")) for r in args.row)] if args.row else ROWS
    for lens, hq, hkv in rows:
        name = f"{len(lens)}x{lens[0]} {hq}/{hkv}"
        if keep and not any(name.startswith(k) for k in keep):
            continue
        case, ref, rotated = probe_case(lens, hq, hkv)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        out = torch.empty_like(case.q)
        counters = torch.zeros(len(lens) * hq, dtype=torch.int32, device="cuda")
        if not plan.num_splits or plan.num_splits == 1:
            if plan.backend != "triton":
                print(f"{name:>16} plan {plan.backend} S={plan.num_splits}: not fixed splits, skipped", flush=True)
                continue
            variants = [("single", 1, None, None)]
        else:
            splits = [int(s) for s in args.splits.split(",") if s]
            s0 = plan.num_splits
            around = (s0,) if args.plan_only else (s0 // 2, s0, s0 * 2)
            splits = splits or [s for s in around if 1 < s]
            variants = [(f"fixed S={s}", s, None, None) for s in splits]
            variants += [(f"fused S={s}", s, counters, None) for s in splits if s <= 2 * FIXED_MERGE_MAX_SPLITS]
            for wide in args.combine_wide:
                block_s, d_blocks = map(int, wide.split(","))
                variants += [(f"W{block_s}x{d_blocks} S={s}", s, None, ("wide", (block_s, d_blocks))) for s in splits]
            for tile in args.tile:
                fields = tile.split(",")
                prefetch = fields[-1] == "p"
                block_n, stages, *warps = map(int, fields[:-1] if prefetch else fields)
                config = dict(BLOCK_N=block_n, num_stages=stages, **({"num_warps": warps[0]} if warps else {}))
                if prefetch:
                    config["PREFETCH_PAGES"] = True
                tag = f"N{block_n}s{stages}" + (f"w{warps[0]}" if warps else "") + ("p" if prefetch else "")
                # merged as the plan would merge S splits
                def merges(s):
                    return [False, True] if args.tile_both else [merge_fixed_in_partial(len(lens), 1, hq, s, sms)]

                variants += [
                    (f"{tag}{' fused' * fuse} S={s}", s, counters if fuse else None, config)
                    for s in splits for fuse in merges(s)
                ]  # fmt: skip
        for label, s, ctr, config in variants:
            cycle = itertools.cycle(rotated)

            def fn(c=None, s=s, ctr=ctr, config=config):
                c = c or next(cycle)
                if s == 1:
                    return decode_attention(*c.args, backend="triton", out=out)
                if isinstance(config, tuple):
                    with patch.object(triton_splitk, "COMBINE_WIDE", config[1]):
                        return decode_splitk(*c.args, 128**-0.5, out, None, num_splits=s, counters=ctr)[0]
                return decode_splitk(*c.args, 128**-0.5, out, None, num_splits=s, counters=ctr, config=config)[0]

            first = max_err(fn(case), ref)
            us = do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
            err = max_err(fn(case), ref)
            ok = first < 2e-2 and err < 2e-2 and int(counters.abs().sum()) == 0
            assert ok or args.timing_only, (name, label, first, err, counters.nonzero())
            is_plan = s == plan.num_splits and config is None and (ctr is None) == (plan.counters is None)
            mark = " (plan)" if is_plan else ""
            note = "" if ok else f"  err {err:.3g}, counters {int(counters.abs().sum())}"
            counters.zero_()
            print(f"{name:>16} {label:>12} {us:7.1f}{mark}{note}", flush=True)
            if args.no_combine and s > 1 and ctr is None:
                # the graph's calls unchained (a partial that expects its combine lets the next kernel launch at its
                # top: with the combine gone, the next call's partial programs would sit waiting beside this one's),
                # with the combine launch and without it: the partial kernel alone
                with patch.object(triton_common, "CHAIN_PDL", False):
                    us = do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
                    print(f"{name:>16} {label + ' unchained':>12} {us:7.1f}", flush=True)
                    with patch.object(triton_splitk, "launch_combine", lambda *a, **k: None):
                        us = do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
                print(f"{name:>16} {label + ' alone':>12} {us:7.1f}", flush=True)


if __name__ == "__main__":
    main()
