"""What the single pass pays beyond its loads on grids of several programs per SM: ceiling_probe's `dots` kernel
(the same page gather and the decode's two products, no softmax) read 256 x 256 12/2 in 18.9-19.0 µs with 32-token
tiles at 3 stages and 512 programs, where the single pass (the same grid and tile, plus the softmax, the page-id
prefetch, early page ids and PDL chaining) took 20.1. This times the single pass with each of those taken away in
turn, beside the dots kernel on the same grid, in one process. Run on the GPU machine; writes $OUT/single_cost.jsonl
and prints a table last (graph µs, caches rotated out of L2; the single pass's outputs checked against float64).

    python scripts/single_cost_probe.py
"""

import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ceiling_probe import gather  # noqa: E402

from flashdecode import decode_attention, plan_decode, triton_common  # noqa: E402
from flashdecode.bench import ProbeLog, Row, probe_case  # noqa: E402
from flashdecode.bench import probe_graph_us as graph_us  # noqa: E402
from flashdecode.triton_common import launch_config  # noqa: E402
from flashdecode.triton_single import decode_single  # noqa: E402

ROWS = [
    Row([256] * 256, 12, 2), Row([512] * 128, 12, 2), Row([1024] * 64, 12, 2), Row([256] * 128, 28, 4),
    Row([2048] * 64, 32, 8), Row([128] * 8, 28, 4),
]  # fmt: skip
# name: (overrides of the single pass's config, chained with PDL)
VARIANTS = {
    "t32s3 (prefetch tile)": (dict(BLOCK_N=32, num_stages=3, PREFETCH_PAGES=True), True),
    "t32s3 no PDL": (dict(BLOCK_N=32, num_stages=3, PREFETCH_PAGES=True), False),
    "t32s3 no prefetch": (dict(BLOCK_N=32, num_stages=3, PREFETCH_PAGES=False), True),
    "t32s4": (dict(BLOCK_N=32, num_stages=4, PREFETCH_PAGES=True), True),
    "t64s3": (dict(BLOCK_N=64, num_stages=3, PREFETCH_PAGES=True), True),
    "t64s3 no prefetch": (dict(BLOCK_N=64, num_stages=3, PREFETCH_PAGES=False), True),
    "t128s3": (dict(BLOCK_N=128, num_stages=3, PREFETCH_PAGES=True), True),
    # 64 query rows (the group padded): Triton takes the warpgroup MMA, rows over the warps, so a row's scores stay
    # in one warp (sm_90 compile: warpsPerCTA [4, 1], 126 registers at 32 tokens)
    "h64 t32s3": (dict(BLOCK_H=64, BLOCK_N=32, num_stages=3, PREFETCH_PAGES=True), True),
    "h64 t32s3 w8": (dict(BLOCK_H=64, BLOCK_N=32, num_stages=3, PREFETCH_PAGES=True, num_warps=8), True),
    "h64 t64s3": (dict(BLOCK_H=64, BLOCK_N=64, num_stages=3, PREFETCH_PAGES=True), True),
    "h64 t128s3": (dict(BLOCK_H=64, BLOCK_N=128, num_stages=3, PREFETCH_PAGES=True), True),
}
DOTS = [(32, 3), (64, 3), (128, 3)]


def main():
    if sys.argv[1:]:
        sys.exit(f"usage: python scripts/single_cost_probe.py, got {' '.join(sys.argv[1:])!r}")
    log = ProbeLog("single_cost")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for row in ROWS:
        case, ref, copies = probe_case(row.seqlens, row.num_q_heads, row.num_kv_heads)
        group = row.num_q_heads // row.num_kv_heads
        out = torch.empty_like(case.q)
        scale = 128**-0.5
        res, errs = {}, {}
        cit = itertools.cycle(copies)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        res["plan"] = graph_us(lambda: decode_attention(*next(cit).args, out=out, plan=plan))
        base = launch_config(128, group, torch.bfloat16, single=True)
        for name, (over, pdl) in VARIANTS.items():
            cfg = dict(base, **over)
            triton_common.CHAIN_PDL = pdl
            out.fill_(float("nan"))
            decode_single(*case.args, scale, out, None, config=cfg, num_sms=sms)
            errs[name] = (out.double() - ref.double()).abs().max().item()
            res[name] = graph_us(lambda: decode_single(*next(cit).args, scale, out, None, config=cfg, num_sms=sms))
        triton_common.CHAIN_PDL = True
        # the dots kernel over the same grid: one chunk per (sequence, KV head)
        chunks = [(b, 0, n) for b, n in enumerate(row.seqlens)]
        ch = torch.tensor(chunks, dtype=torch.int32, device="cuda").T.contiguous()
        sink = torch.empty(len(chunks) * row.num_kv_heads, device="cuda")
        for bn, stages in DOTS:
            res[f"dots t{bn}s{stages}"] = graph_us(
                lambda: gather(next(cit), ch, sink, row.num_kv_heads, bn, stages, dots=True))
        rec = dict(row=row.name(), **{k: round(v, 2) for k, v in res.items()}, max_err=max(errs.values()))
        line = f"{row.name():<14} " + "  ".join(f"{k} {v:.1f}" for k, v in res.items())
        log.row(rec, line + f"  max err {max(errs.values()):.1e}")
    log.close()


if __name__ == "__main__":
    main()
