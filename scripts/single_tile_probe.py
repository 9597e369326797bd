"""Single-pass tiles for grids of at most one program per SM (``PREFETCH_ONE_WAVE_TILE``: 64 tokens, 3 stages, the
page ids a tile ahead) and of up to two: deeper pipelines and larger tiles, since such a program has an SM's shared
memory to itself. Every variant is checked against the float64 reference, then timed (CUDA-graph median, caches
rotated out of L2). Writes $OUT/single_tile.jsonl, prints a table last.

    python scripts/single_tile_probe.py [--tiles N,W,S[;N,W,S...]] [--rows B,L,Hq,Hkv[;...]]

--tiles (BLOCK_N, num_warps, num_stages) and --rows replace the lists below.
"""

import argparse
import itertools

import torch
from triton.testing import do_bench_cudagraph

from flashdecode.bench import ProbeLog, Row, probe_case
from flashdecode.check import max_err
from flashdecode.triton_single import decode_single

# 128 programs (0.97 a SM) and a few smaller or larger grids of the grouped prefetching tile
ROWS = [Row([1024] * 64, 12, 2), Row([512] * 64, 12, 2), Row([1024] * 32, 28, 4), Row([1024] * 16, 32, 8),
        Row([2048] * 16, 32, 8), Row([512] * 128, 12, 2), Row([128] * 8, 28, 4), Row([128], 28, 4)]  # fmt: skip
# (BLOCK_N, num_warps, num_stages), all with the page-id prefetch; the first is the library's one-wave tile
TILES = [(64, 4, 3), (64, 4, 4), (64, 4, 5), (64, 8, 4), (128, 4, 2), (128, 4, 3), (128, 8, 3), (32, 4, 6)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", default="", help="BLOCK_N,num_warps,num_stages;... instead of TILES")
    ap.add_argument("--rows", default="", help="B,L,Hq,Hkv;... instead of ROWS")
    args = ap.parse_args()
    global TILES, ROWS
    if args.tiles:
        TILES = [tuple(map(int, t.split(","))) for t in args.tiles.split(";")]
    if args.rows:
        ROWS = [Row([ln] * b, hq, hkv) for b, ln, hq, hkv in (map(int, r.split(",")) for r in args.rows.split(";"))]
    log = ProbeLog("single_tile")
    names = [f"{bn}/{w}/{s}" for bn, w, s in TILES]
    log.line(f"{'row (best of 2, graph µs)':<26}" + "".join(f"{n:>10}" for n in names))
    for row in ROWS:
        c, ref, copies = probe_case(row.seqlens, row.num_q_heads, row.num_kv_heads)
        out = torch.empty_like(c.q)
        res = {}
        for (bn, warps, stages), again in itertools.product(TILES, (0, 1)):
            cfg = dict(BLOCK_N=bn, num_warps=warps, num_stages=stages, PREFETCH_PAGES=True)
            it = itertools.cycle(copies)

            def fn():
                return decode_single(*next(it).args, 128**-0.5, out, None, config=cfg, num_sms=132)

            name = f"{bn}/{warps}/{stages}"
            try:
                err = max_err(fn()[0], ref)
                assert err < 2e-2, f"error {err}"
                us = do_bench_cudagraph(fn) * 1e3
            except Exception as e:  # noqa: BLE001 (a tile that does not fit is a result too)
                us = None
                print(name, row.name(), type(e).__name__, str(e)[:120], flush=True)
            res[name] = min(us, res.get(name) or us) if us else res.get(name)
            log.record(dict(row=row.name(), tile=name, run=again, us=us))
        log.line(f"{row.name():<26}" + "".join(f"{res[n]:10.1f}" if res.get(n) else f"{'-':>10}" for n in names))
    log.close()


if __name__ == "__main__":
    main()
