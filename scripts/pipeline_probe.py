"""K/V load pipelining probe: tiles x stages on split-K and single-pass rows, for whichever flashdecode is on the
path (run it once per code version, with a tag). Graph µs, caches rotated out of L2, every variant checked against
the float64 reference first. Writes $OUT/pipeline-<tag>.jsonl and prints a table last.

    python scripts/pipeline_probe.py base
    PYTHONPATH=<patched tree>/src python scripts/pipeline_probe.py prefetch
"""

import itertools
import json
import os
import sys

import torch
from triton.testing import do_bench_cudagraph

import flashdecode
from flashdecode import triton_splitk
from flashdecode.bench import Row, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense
from flashdecode.triton_single import decode_single

GQA = [(64, 4, 3), (64, 4, 2), (32, 4, 3), (32, 4, 4), (64, 4, 4)]
MHA = [(128, 4, 2), (64, 4, 3), (32, 4, 3), (32, 4, 4), (64, 4, 4), (128, 8, 3)]
# (row, split-K or single pass, tiles)
ROWS = [
    (Row([256] * 256, 12, 2), "split", GQA), (Row([1024] * 64, 12, 2), "split", GQA),
    (Row([4096] * 16, 12, 2), "split", GQA), (Row([65536], 12, 2), "split", GQA),
    (Row([2048] * 8, 28, 4), "split", GQA), (Row([2048], 28, 4), "split", GQA),
    (Row([4096] * 16, 12, 12), "split", MHA), (Row([16384] * 4, 12, 12), "split", MHA),
    (Row([65536], 12, 12), "split", MHA),
    (Row([256] * 256, 12, 12), "single", MHA), (Row([1024] * 64, 12, 12), "single", MHA),
    (Row([4096] * 64, 32, 8), "single", GQA), (Row([128] * 8, 28, 4), "single", GQA),
    (Row([128], 28, 4), "single", GQA), (Row([256] * 256, 12, 2), "single", GQA),
]  # fmt: skip


def main():
    tag = sys.argv[1] if len(sys.argv) > 1 else "run"
    out_dir = os.environ.get("OUT", ".")
    log = open(os.path.join(out_dir, f"pipeline-{tag}.jsonl"), "w")
    print(f"flashdecode from {os.path.dirname(flashdecode.__file__)}", flush=True)
    l2 = _l2_bytes("cuda")
    table = []
    for row, mode, tiles in ROWS:
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, 128, 16, torch.bfloat16, "cuda",
                              spare_pages=0)  # fmt: skip
        ref, _ = reference_dense(*c.args, device="cuda")
        copies = rotation_copies(c, l2)
        out = torch.empty_like(c.q)
        res = {}
        for bn, warps, stages in tiles:
            cfg = dict(BLOCK_N=bn, num_warps=warps, num_stages=stages)
            it = itertools.cycle(copies)
            if mode == "split":
                def fn():
                    return triton_splitk.decode_splitk(*next(it).args, 128**-0.5, out, None, config=cfg)
            else:
                def fn():
                    return decode_single(*next(it).args, 128**-0.5, out, None, config=cfg)
            name = f"{bn}/{warps}/{stages}"
            try:
                err = max_err(fn()[0], ref)
                assert err < 0.05, f"wrong: err {err}"
                res[name] = do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
            except Exception as e:  # noqa: BLE001 - a failing variant is reported, the probe goes on
                print(f"{row.name()} {mode} {name} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
        log.write(json.dumps(dict(row=row.name(), mode=mode, tag=tag, **{k: round(v, 2) for k, v in res.items()}))
                  + "\n")  # fmt: skip
        log.flush()
        line = f"{tag:<9} {mode:<6} {row.name():<16} " + "  ".join(f"{k} {v:6.1f}" for k, v in res.items())
        table.append(line)
        print(line, flush=True)
    print()
    for line in table:
        print(line)


if __name__ == "__main__":
    main()
