"""Launch-parameter sweep of triton_tma on the GPU (scripts/gpu_tma.sh runs it).

For a few anchor rows: triton (single pass) and triton_splitk (planned) as baselines, then triton_tma at its
``tma_config`` default and with one parameter changed at a time (pages per tile, stages, warps, the planner's
programs per SM), then with the best value of each parameter combined. Each config is checked against the
float64 reference before it is timed with ``flashdecode.bench.time_gpu`` (CUDA-graph median, L2 rotated). One JSON
line per (row, config) goes to stdout and $OUT/sweep_tma.jsonl as it runs; the best per row comes last.
"""

import json
import os
import sys
import time

import torch

from flashdecode import triton_tma
from flashdecode.bench import Row, _l2_bytes, rotation_copies, time_gpu
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err, output_tolerance
from flashdecode.reference import reference_dense
from flashdecode.triton_single import decode_single
from flashdecode.triton_splitk import decode_splitk

ROWS = [
    Row([65536], 12, 12),  # 403 MB, one sequence: split-K fills the SMs
    Row([65536], 12, 2),  # 67 MB, launch/latency bound (0.81-0.85x FlashInfer)
    Row([131072], 32, 32),  # 2.1 GB long MHA (0.80x FlashInfer)
    Row([4096] * 64, 32, 8),  # 1 GB GQA batch
]
# one factor at a time around tma_config's default
VARIANTS = {
    "PAGES_PER_TILE": [1, 2, 8],
    "num_stages": [2, 4],
    "num_warps": [8],
    "PROGRAMS_PER_SM": [1, 4, 8],
}
# a row's sweep stops after this many seconds (compiles included), so the whole script stays in its budget
ROW_BUDGET_S = float(os.environ.get("SWEEP_ROW_BUDGET_S", "28"))


def main():
    out_dir = os.environ.get("OUT", ".")
    log = open(os.path.join(out_dir, "sweep_tma.jsonl"), "w")
    l2 = _l2_bytes("cuda")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    best_rows = []
    for row in ROWS:
        started = time.time()
        c = random_paged_case(
            row.seqlens, row.num_q_heads, row.num_kv_heads, 128, 16, torch.bfloat16, "cuda", spare_pages=0
        )
        ref, _ = reference_dense(*c.args, device="cuda")
        tol = output_tolerance(c.args, ref)
        copies = rotation_copies(c, l2)
        scale = 128**-0.5
        group = row.num_q_heads // row.num_kv_heads
        default = triton_tma.tma_config(128, group, 16)

        def tma(cfg):
            return lambda case: decode_tma_call(case, scale, cfg, num_sms)

        candidates = [
            ("triton", {}, lambda case: decode_single(*case.args, scale, torch.empty_like(case.q), None)[0]),
            ("triton_splitk", {}, lambda case: decode_splitk(*case.args, scale, torch.empty_like(case.q), None)[0]),
            ("tma", {}, tma({})),
        ]
        for key, values in VARIANTS.items():
            candidates += [("tma", {key: v}, tma({key: v})) for v in values if v != default[key]]
        records = []
        for kind, cfg, fn in candidates:
            rec = run_one(row, kind, {**default, **cfg} if kind == "tma" else {}, fn, c, ref, tol, copies)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            records.append((cfg, rec))
            if time.time() - started > ROW_BUDGET_S:
                print(f"{row.name()}: row budget of {ROW_BUDGET_S:.0f} s spent, rest skipped", flush=True)
                break
        # the best value of each factor, combined
        tma_ok = [(cfg, r) for cfg, r in records if r["kind"] == "tma" and r.get("us")]
        combined = {}
        for key in VARIANTS:
            timed = [(r["us"], cfg.get(key, default[key])) for cfg, r in tma_ok if set(cfg) <= {key}]
            if timed:
                combined[key] = min(timed)[1]
        if tma_ok and combined and any(combined[k] != default[k] for k in combined):
            rec = run_one(row, "tma", {**default, **combined}, tma(combined), c, ref, tol, copies)
            log.write(json.dumps(rec) + "\n")
            records.append((combined, rec))
        tma = [r for _, r in records if r["kind"] == "tma" and r.get("us")]
        best_tma = min(tma, key=lambda r: r["us"], default=None)
        base = {r["kind"]: r.get("us") for _, r in records if r["kind"] != "tma"}
        best_rows.append(dict(row=row.name(), **{f"{k}_us": v for k, v in base.items()}, best_tma=best_tma))
        del copies, c
        torch.cuda.empty_cache()
    print("BEST " + json.dumps(best_rows), flush=True)


def decode_tma_call(case, scale, cfg, num_sms):
    out = torch.empty_like(case.q)
    triton_tma.decode_tma(*case.args, scale, out, None, num_sms=num_sms, config=cfg)
    return out


def run_one(row, kind, cfg, fn, case, ref, tol, copies):
    rec = dict(row=row.name(), kind=kind, **{k: v for k, v in cfg.items() if k not in ("BLOCK_H", "BLOCK_D")})
    try:
        err = max_err(fn(case), ref)
        rec["max_err"] = err
        if err > tol:
            rec["error"] = f"wrong: max |out - ref| = {err:.3g} > {tol:.3g}; not timed"
        else:
            graph_us, eager_us, note, _ = time_gpu(fn, copies)
            rec.update(us=round(graph_us, 2) if graph_us else None, eager_us=round(eager_us, 2))
            rec["gbps"] = round(row.io_bytes() / graph_us / 1e3) if graph_us else None
            if note:
                rec["note"] = note
    except Exception as e:  # one config failing (compile, shared memory) must not stop the sweep
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    print(json.dumps(rec), flush=True)
    return rec


if __name__ == "__main__":
    sys.exit(main())
