"""Split-K partial tiles for short chunks (GQA groups >= 4, the 12/2 and 28/4 anchor rows; with the argument ``mha``,
the planned 12/12 rows): BLOCK_N x warps x stages, with the planner at 2 (8 for MHA) and 4 programs per SM. Run on the
GPU machine; writes $OUT/tile.jsonl and prints the table last (graph µs, caches rotated out of L2, every variant checked
against the float64 reference first).
"""

import itertools

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import triton_splitk
from flashdecode.bench import ProbeLog, Row, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense
from flashdecode.triton_single import decode_single

import sys

GQA_ROWS = [
    Row([256] * 256, 12, 2), Row([1024] * 64, 12, 2), Row([4096] * 16, 12, 2), Row([16384] * 4, 12, 2),
    Row([65536], 12, 2), Row([2048] * 8, 28, 4), Row([2048], 28, 4),
]  # fmt: skip
# `python scripts/tile_probe.py mha`: the planned 12-KV-head MHA rows
MHA_ROWS = [Row([4096] * 16, 12, 12), Row([16384] * 4, 12, 12), Row([65536], 12, 12), Row([131072], 12, 12)]
MHA = len(sys.argv) > 1 and sys.argv[1] == "mha"
ROWS = MHA_ROWS if MHA else GQA_ROWS
TILES = [(64, 4, 3), (64, 4, 2), (32, 4, 3), (32, 4, 4), (128, 4, 2), (128, 8, 2), (64, 8, 3)]
SATURATIONS = [4, 8] if MHA else [4, 2]


def main():
    log = ProbeLog("tile")
    l2 = _l2_bytes("cuda")
    default_sat = triton_splitk.SATURATION_PER_SM
    default_table = triton_splitk.PLANNER_SATURATION
    for row in ROWS:
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, 128, 16, torch.bfloat16, "cuda",
                              spare_pages=0)  # fmt: skip
        ref, _ = reference_dense(*c.args, device="cuda")
        copies = rotation_copies(c, l2)
        out = torch.empty_like(c.q)
        res = {}
        for (bn, warps, stages), sat in itertools.product(TILES, SATURATIONS):
            cfg = dict(BLOCK_N=bn, num_warps=warps, num_stages=stages)
            # the probe's target for every tile: SATURATION_PER_SM, with the per-tile PLANNER_SATURATION off
            triton_splitk.PLANNER_SATURATION, triton_splitk.SATURATION_PER_SM = None, sat
            it = itertools.cycle(copies)

            def fn():
                return triton_splitk.decode_splitk(*next(it).args, 128**-0.5, out, None, config=cfg)

            name = f"{bn}/{warps}/{stages}/s{sat}"
            try:
                err = max_err(fn()[0], ref)
                assert err < 0.05, f"wrong: err {err}"
                res[name] = do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
            except Exception as e:  # noqa: BLE001 - a failing variant is reported, the probe goes on
                print(f"{row.name()} {name} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
        triton_splitk.SATURATION_PER_SM = default_sat
        triton_splitk.PLANNER_SATURATION = default_table
        if row.batch * row.num_kv_heads >= 256 and not MHA:
            for bn, warps, stages in TILES[:5]:
                cfg = dict(BLOCK_N=bn, num_warps=warps, num_stages=stages)
                it = itertools.cycle(copies)
                res[f"single {bn}/{warps}/{stages}"] = do_bench_cudagraph(
                    lambda: decode_single(*next(it).args, 128**-0.5, out, None, config=cfg), rep=30,
                    return_mode="median") * 1e3  # fmt: skip
        base = res.get("128/4/2/s4" if MHA else "64/4/3/s4", float("nan"))
        best = min(res.items(), key=lambda kv: kv[1])
        log.row(dict(row=row.name(), **{k: round(v, 2) for k, v in res.items()}),
                f"{row.name():<16} base {base:>6.1f}  best {best[1]:>6.1f} ({best[0]})")
    log.close()


if __name__ == "__main__":
    main()
