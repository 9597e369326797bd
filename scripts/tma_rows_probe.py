"""triton_tma's page boxes on the 12/2 rows, with fixed splits and the deeper tiles the pointer kernels now use at
one program per SM (128 tokens, 3-4 stages), against the plan in the same process. Run on the GPU machine; writes
$OUT/tma_rows.jsonl and prints a table last (graph µs, caches rotated out of L2, each variant's output checked
against the float64 reference).

    python scripts/tma_rows_probe.py
"""

import itertools
import sys

import torch

from flashdecode import decode_attention, plan_decode, triton_tma
from flashdecode.bench import ProbeLog, Row, probe_case
from flashdecode.bench import probe_graph_us as graph_us

# (row, fixed split counts to try)
ROWS = [
    (Row([1024] * 64, 12, 2), (1, 2)),
    (Row([256] * 256, 12, 2), (1,)),
    (Row([4096] * 16, 12, 2), (4, 8)),
    (Row([65536], 12, 2), (66, 128, 256)),
    (Row([2048] * 8, 28, 4), (4, 8)),
]
# (pages per tile, stages, warps)
TILES = [(4, 3, 4), (8, 3, 4), (8, 4, 4), (8, 3, 8), (2, 4, 4)]


def main():
    if sys.argv[1:]:
        sys.exit(f"usage: python scripts/tma_rows_probe.py, got {' '.join(sys.argv[1:])!r}")
    log = ProbeLog("tma_rows")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for row, splits in ROWS:
        case, ref, copies = probe_case(row.seqlens, row.num_q_heads, row.num_kv_heads)
        out = torch.empty_like(case.q)
        scale = 128**-0.5
        res, errs = {}, {}
        cit = itertools.cycle(copies)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        res["plan"] = graph_us(lambda: decode_attention(*next(cit).args, out=out, plan=plan))
        for s, (pages, stages, warps) in itertools.product(splits, TILES):
            cfg = dict(PAGES_PER_TILE=pages, num_stages=stages, num_warps=warps)
            key = f"S{s}/p{pages}s{stages}w{warps}"
            try:
                out.fill_(float("nan"))
                triton_tma.decode_tma(*case.args, scale, out, None, num_splits=s, num_sms=sms, config=cfg)
                errs[key] = (out.double() - ref.double()).abs().max().item()
                res[key] = graph_us(
                    lambda: triton_tma.decode_tma(*next(cit).args, scale, out, None, num_splits=s, num_sms=sms,
                                                  config=cfg)  # fmt: skip
                )
            except Exception as e:  # a tile that does not fit shared memory must not stop the rest
                print(f"{row.name()} {key}: {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)
        rec = dict(row=row.name(), **{k: round(v, 2) for k, v in res.items()}, max_err=max(errs.values(), default=None))
        best = min((v, k) for k, v in res.items() if k != "plan")
        line = (f"{row.name():<16} plan {res['plan']:>6.1f}  best TMA {best[0]:>6.1f} ({best[1]})  "
                f"max err {max(errs.values()):.1e}")  # fmt: skip
        log.row(rec, line)
        print("   ", {k: round(v, 1) for k, v in res.items() if k != "plan"}, flush=True)
    log.close()


if __name__ == "__main__":
    main()
