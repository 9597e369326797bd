"""Where does the Gluon single pass (gluon_single) beat the tl one? Both kernels through ``decode_single`` in batch
order (as a plan's single pass runs), over grids of 1 to 16 programs a SM, timed alternately in one process; what
``gluon_single.pays`` is set from (docs/design.md, "A Gluon single pass in the library").

Each row: the plan's choice for it, then graph µs of the tl single pass and the Gluon kernel with 2 ring buffers of
32-token steps, its row sums deferred (the library's default) or not, and 3 buffers (``--variants``: gNxS, N tokens a
step, S buffers; a trailing d defers the row sums; gluon-gate-03970a1 and -e76ff69 ran before DEFER_SUM existed, and
their variants sum every step), each timed twice (ABCABC: the H200's host runs a process at one of two paces, so only
same-process pairs compare), after a check against the float64 reference.

    python scripts/gluon_gate_probe.py [--rows B,L,Hq,Hkv[;...]] [--variants tl,g32x2d,g128x3d]
    # on the GPU; writes $OUT/gluon_gate.jsonl, a table last
"""

import argparse

import torch

from flashdecode import gluon_single, plan_decode
from flashdecode.bench import ProbeLog, probe_case, probe_rows, probe_variants
from flashdecode.triton_single import decode_single

ROWS = [(b, ln, 12, 2) for b in (64, 128, 192, 256, 384, 512, 768, 1024) for ln in (256, 1024)]
ROWS += [(b, ln, 28, 4) for b in (32, 64, 128, 256) for ln in (512, 2048)]
ROWS += [(b, ln, 32, 8) for b in (32, 64, 128) for ln in (1024, 4096)]
ROWS += [(b, 1024, hq, hkv) for b in (64, 128) for hq, hkv in ((16, 8), (32, 32))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="", help="B,L,Hq,Hkv;... instead of ROWS")
    ap.add_argument("--variants", default="tl,g32x2d,g32x2,g32x3d",
                    help="tl and gNxS[d] (N tokens a step, S ring buffers, d: row sums deferred)")
    args = ap.parse_args()
    rows = probe_rows(args.rows, ROWS)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    log = ProbeLog("gluon_gate")
    for batch, length, hq, hkv in rows:
        case, ref, copies = probe_case([length] * batch, hq, hkv)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        choice = f"{plan.backend}/{plan.num_splits}"
        out = torch.empty_like(case.q)
        scale = case.q.shape[-1] ** -0.5
        variants = {}
        for v in args.variants.split(","):
            if v == "tl":
                variants[v] = lambda c: decode_single(*c.args, scale, out, num_sms=sms, gluon=False)
            else:
                n, s = map(int, v[1:].rstrip("d").split("x"))
                variants[v] = lambda c, n=n, s=s, d=v.endswith("d"): gluon_single.decode_single_gluon(
                    *c.args, scale, out, stages=s, block_n=n, defer_sum=d)
        errs, times = probe_variants(variants, case, ref, copies, out)
        name = f"{batch}x{length} {hq}/{hkv}"
        per_sm = batch * hkv / sms
        log.row(
            dict(row=name, programs_per_sm=per_sm, plan=choice, errs=errs, us=times),
            f"{name:<16} {per_sm:5.2f}/SM plan {choice:<18} "
            + "  ".join(f"{k} {min(v):8.2f} ({max(v):.2f})" for k, v in times.items())
            + (f"  best/tl {min(min(v) for v in times.values()) / min(times['tl']):.3f}" if "tl" in times else ""),
        )  # fmt: skip
    log.close()


if __name__ == "__main__":
    main()
