"""Does the single pass gain from holding q in registers? The Gluon (Triton's explicit-layout dialect) single pass,
``flashdecode.gluon_single``, with q in registers or read from shared memory at each step, timed beside the library's
plan.

The library's `tl` kernel re-reads its 16 x 128 q tile from shared memory at every step (8 of the loop's 18
`LDSM`, docs/design.md "Masks and clamped tokens"): Triton keeps that MMA operand in shared memory. The Gluon kernel
converts q once to the MMA's A-operand layout and keeps it in registers (q_regs True), or reads it from shared memory
at each step as Triton does (q_regs False), everything else alike (gluon_single's docstring: 4 warps, 32-token steps,
K/V gathered by cp.async into a ring of 2 or 3 buffers, page ids a step ahead, PDL). The ragged rows put NaN in every
slot past each length. Until session #14 this script held its own copy of that kernel (the same algorithm; the
library's is its generalisation), which made these runs: at 69ebf3b (no PDL, ids after the length, 3 and 4 buffers)
q in registers took 256 x 256 12/2 20.89 -> 20.30 us, 512 x 512 12/2 68.49 -> 67.33, against the library's 19.47
and 69.29 (h200-2026-11-30/gluon-69ebf3b); with PDL, 2 buffers and q in registers 256 x 256 12/2 18.62-18.83 us
against the library's 19.44-19.75 in five processes (gluon-6a9ffcd, gluon-26bab2b, gluon-ddfb875, gluon-73d600e;
docs/design.md, "A Gluon single pass: under 19 µs"). The library's plan takes the Gluon kernel itself on some of
these grids since 03970a1 ("A Gluon single pass in the library"): the "library (plan)" column is then the same kernel.

    python scripts/gluon_probe.py [--rows B,L,Hq,Hkv[;...]]   # on the GPU; writes $OUT/gluon.jsonl, a table last
"""

import argparse
import itertools

import torch

from flashdecode import decode_attention, gluon_single, plan_decode
from flashdecode.bench import ProbeLog, probe_case, probe_graph_us
from flashdecode.cases import poison_page_tails


RAGGED = [0, 1, 17, 31, 33, 100, 255, 513] * 32
ROWS = [([256] * 256, 12, 2), ([512] * 128, 12, 2), ([512] * 512, 12, 2), ([2048] * 32, 28, 4), (RAGGED, 12, 2),
        (RAGGED, 28, 4)]  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="", help="B,L,Hq,Hkv;... (uniform rows) instead of ROWS")
    args = ap.parse_args()
    rows = ROWS
    if args.rows:
        rows = [([ln] * b, hq, hkv) for b, ln, hq, hkv in (map(int, r.split(",")) for r in args.rows.split(";"))]
    log = ProbeLog("gluon")
    for seqlens, hq, hkv in rows:
        case, ref, copies = probe_case(seqlens, hq, hkv)
        for c in copies:
            poison_page_tails(c)
        name = f"{len(seqlens)}x{seqlens[0]} {hq}/{hkv}" if len(set(seqlens)) == 1 else f"ragged {hq}/{hkv}"
        out = torch.empty_like(case.q)
        res = {}
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        variants = {"library (plan)": lambda c: decode_attention(*c.args, out=out, plan=plan)}
        for q_regs, stages in ((True, 2), (True, 3), (False, 2), (False, 3)):
            variants[f"gluon q {'regs' if q_regs else 'smem'} s{stages}"] = (
                lambda c, q_regs=q_regs, stages=stages: gluon_single.decode_single_gluon(
                    *c.args, c.q.shape[-1] ** -0.5, out, stages=stages, q_regs=q_regs))
        for key, fn in variants.items():
            out.fill_(float("nan"))
            fn(case)
            err = (out.double() - ref).abs().max().item()
            it = itertools.cycle(copies)
            us = probe_graph_us(lambda: fn(next(it))) if err < 2e-2 else None
            res[key] = us
            log.record(dict(row=name, variant=key, us=us, err=err))
            log.line(f"{name:<14} {key:<22} " + (f"{us:7.2f} us" if us else f"wrong: error {err:.3g}")
                     + f"  (error {err:.2e})")  # fmt: skip
    log.close()


if __name__ == "__main__":
    main()
