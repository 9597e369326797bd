"""The plan's split rows with their partial tiles at 64 query rows (the GQA group padded to 64, so that Triton takes
the warpgroup MMA and keeps each row's scores in one warp). single_cost_probe found that tile 0.8 µs faster than the
library's 16-row one on a single pass of two programs per SM (128 x 512 12/2, 20.3 -> 19.5 µs) and slower on grids
of one or of four; the plan's long split tiles run one (GROUPED_LONG_TILE) and two (GROUPED_MID_TILE) programs per
SM. Run on the GPU machine; writes $OUT/wgmma_split.jsonl and prints a table last (graph µs, caches rotated, the
plan's outputs checked against the float64 reference with and without).

    python scripts/wgmma_split_probe.py
"""

import itertools
import sys

import torch

from flashdecode import decode_attention, launcher, plan_decode, triton_splitk
from flashdecode.bench import ProbeLog, Row, probe_case
from flashdecode.bench import probe_graph_us as graph_us

ROWS = [
    Row([4096] * 16, 12, 2), Row([16384] * 4, 12, 2), Row([65536], 12, 2), Row([131072], 12, 2),
    Row([2048] * 8, 28, 4), Row([2048], 28, 4), Row([8192] * 8, 32, 8), Row([4096] * 2, 12, 2),
]  # fmt: skip
# name: (GROUPED_LONG_TILE, GROUPED_MID_TILE) overrides
VARIANTS = {
    "library": ({}, {}),
    "h64": (dict(BLOCK_H=64), dict(BLOCK_H=64)),
    "h64 mid32": (dict(BLOCK_H=64), dict(BLOCK_H=64, BLOCK_N=32)),
}


def main():
    if sys.argv[1:]:
        sys.exit(f"usage: python scripts/wgmma_split_probe.py, got {' '.join(sys.argv[1:])!r}")
    log = ProbeLog("wgmma_split")
    long0, mid0 = dict(triton_splitk.GROUPED_LONG_TILE), dict(triton_splitk.GROUPED_MID_TILE)
    for row in ROWS:
        case, ref, copies = probe_case(row.seqlens, row.num_q_heads, row.num_kv_heads)
        out = torch.empty_like(case.q)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        res, errs = {}, {}
        cit = itertools.cycle(copies)
        for rep, (name, (long_over, mid_over)) in itertools.product((1, 2), VARIANTS.items()):
            triton_splitk.GROUPED_LONG_TILE.clear()
            triton_splitk.GROUPED_LONG_TILE.update(long0, **long_over)
            triton_splitk.GROUPED_MID_TILE.clear()
            triton_splitk.GROUPED_MID_TILE.update(mid0, **mid_over)
            launcher.clear()
            out.fill_(float("nan"))
            decode_attention(*case.args, out=out, plan=plan)
            errs[name] = (out.double() - ref.double()).abs().max().item()
            res[f"{name} {rep}"] = graph_us(lambda: decode_attention(*next(cit).args, out=out, plan=plan))
        rec = dict(row=row.name(), plan=plan.reason, **{k: round(v, 2) for k, v in res.items()},
                   max_err=max(errs.values()))  # fmt: skip
        line = f"{row.name():<14} " + "  ".join(f"{k} {v:.1f}" for k, v in res.items())
        log.row(rec, line + f"  max err {max(errs.values()):.1e}  ({plan.reason[:60]})")
    log.close()


if __name__ == "__main__":
    main()
