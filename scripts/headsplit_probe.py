"""Head blocks of fewer rows than the tile: the single pass with a KV head's query rows cut into 2+ head blocks
(``HEAD_ROWS`` rows each, the tile still 16 rows high), so a grid of one program per (sequence, KV head) becomes two
or more programs per SM with no merge. The programs of one KV head are neighbours in the grid and read the same
pages at about the same time: DRAM serves each page once, L2 serves it HEAD_BLOCKS times. Run on the GPU machine;
writes $OUT/headsplit.jsonl and prints a table last (graph µs, caches rotated out of L2, each variant's output
checked against the float64 reference).

    python scripts/headsplit_probe.py
"""

import itertools
import json
import os
import sys

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, plan_decode
from flashdecode.bench import Row, probe_case
from flashdecode.triton_common import (
    PREFETCH_ONE_WAVE_TILE,
    PREFETCH_ONE_WAVE_TILE_64,
    PREFETCH_TILE,
    launch_config,
)
from flashdecode.triton_single import decode_single

# (row, HEAD_ROWS values to try)
ROWS = [
    (Row([1024] * 64, 12, 2), (3,)),
    (Row([1024] * 32, 12, 2), (3, 2)),
    (Row([512] * 128, 12, 2), (3,)),
    (Row([1024] * 96, 12, 2), (3,)),
    (Row([256] * 256, 12, 2), (3,)),
    (Row([4096] * 16, 12, 2), (3, 2)),
    (Row([2048] * 8, 28, 4), (4, 2)),
    (Row([2048] * 16, 28, 4), (4,)),
    (Row([1024] * 16, 32, 8), (2,)),
]
TILES = {"t32": PREFETCH_TILE, "t64": PREFETCH_ONE_WAVE_TILE_64, "t128": PREFETCH_ONE_WAVE_TILE}


def graph_us(fn):
    return do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3


def main():
    if sys.argv[1:]:
        sys.exit(f"usage: python scripts/headsplit_probe.py, got {' '.join(sys.argv[1:])!r}")
    log = open(os.path.join(os.environ.get("OUT", "."), "headsplit.jsonl"), "w")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    table = []
    for row, head_rows in ROWS:
        case, ref, copies = probe_case(row.seqlens, row.num_q_heads, row.num_kv_heads)
        group = row.num_q_heads // row.num_kv_heads
        scale = 128**-0.5
        out = torch.empty_like(case.q)
        res, errs = {}, {}
        cit = itertools.cycle(copies)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        res["plan"] = graph_us(lambda: decode_attention(*next(cit).args, out=out, plan=plan))
        base = launch_config(128, group, torch.bfloat16, single=True)
        for rows in (0, *head_rows):
            blocks = 1 if not rows else -(-group // rows)
            for name, tile in TILES.items():
                cfg = dict(base, **tile)
                if rows:
                    cfg["HEAD_ROWS"] = rows
                key = f"r{rows or group}/{name}"
                out.fill_(float("nan"))
                decode_single(*case.args, scale, out, None, config=cfg, num_sms=sms)
                errs[key] = (out.double() - ref.double()).abs().max().item()
                res[key] = graph_us(lambda: decode_single(*next(cit).args, scale, out, None, config=cfg, num_sms=sms))
                res[key + "/programs"] = row.batch * row.num_kv_heads * blocks
        rec = dict(row=row.name(), **{k: round(v, 2) for k, v in res.items()}, max_err=max(errs.values()))
        log.write(json.dumps(rec) + "\n")
        log.flush()
        timed = {k: v for k, v in res.items() if "/" in k and not k.endswith("programs")}
        full = min((v, k) for k, v in timed.items() if k.startswith(f"r{group}/"))
        split = min((v, k) for k, v in timed.items() if not k.startswith(f"r{group}/"))
        line = (f"{row.name():<16} plan {res['plan']:>6.1f}  one block {full[0]:>6.1f} ({full[1]})  "
                f"split {split[0]:>6.1f} ({split[1]}, {res[split[1] + '/programs']:.0f} programs)  "
                f"max err {max(errs.values()):.1e}")  # fmt: skip
        table.append(line)
        print(line, flush=True)
        print("   ", {k: round(v, 1) for k, v in timed.items()}, flush=True)
    print()
    for line in table:
        print(line)


if __name__ == "__main__":
    main()
