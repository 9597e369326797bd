"""MHA rows through plan_decode with and without the 3-stage MHA tile (plan.MHA_LONG_MIN_TOKENS 4096 / None),
alternated twice in one process (A B A B). Graph µs, caches rotated out of L2, every variant checked against the
float64 reference first. Writes $OUT/mha-plan.jsonl, prints a table last, then the registers and shared memory of
each compiled 128-token partial kernel (what decides how many programs share an SM).

    python scripts/mha_plan_probe.py
"""

import itertools
import json
import os

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, launcher, plan, plan_decode, triton_splitk
from flashdecode.bench import Row, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense

ROWS = [
    # the anchor grid's MHA rows
    Row([65536], 12, 12), Row([16384] * 4, 12, 12), Row([4096] * 16, 12, 12), Row([1024] * 64, 12, 12),
    Row([131072], 12, 12),
    # 384-program grids of 4096-token chunks and longer (the rule's rows)
    Row([131072] * 2, 12, 12), Row([65536] * 2, 12, 12), Row([16384] * 8, 12, 12), Row([131072], 24, 24),
    Row([65536], 48, 48), Row([262144], 6, 6), Row([8192] * 16, 12, 12),
    # ...with lengths that are not powers of two, an even batch of mixed lengths, head dim 64, fp16
    Row([100000], 12, 12), Row([98304] * 2, 12, 12), Row([12000, 16000, 14000, 13000, 15000, 16384, 12500, 14500],
                                                          12, 12),
    Row([131072], 12, 12, head_dim=64), Row([131072], 12, 12, dtype="fp16"),
    # grids the rule leaves alone: 320 and 288 programs, 2048-token chunks
    Row([131072], 20, 20), Row([65536] * 3, 12, 12), Row([131072], 6, 6),
]  # fmt: skip
VARIANTS = [("2-stage", None), ("3-stage", 4096), ("2-stage", None), ("3-stage", 4096)]


def _dtype(name):
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def main():
    out_dir = os.environ.get("OUT", ".")
    log = open(os.path.join(out_dir, "mha-plan.jsonl"), "w")
    l2 = _l2_bytes("cuda")
    threshold = plan.MHA_LONG_MIN_TOKENS
    table = []
    for row in ROWS:
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, row.head_dim, 16, _dtype(row.dtype),
                              "cuda", spare_pages=0)  # fmt: skip
        ref, _ = reference_dense(*c.args, device="cuda")
        copies = rotation_copies(c, l2)
        times, notes = {}, {}
        for name, thr in VARIANTS:
            plan.MHA_LONG_MIN_TOKENS = thr
            launcher.clear()
            p = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
            notes[name] = f"S{p.num_splits}{'L' if p.long_tile else ''}"
            it = itertools.cycle(copies)

            def fn(p=p):
                x = next(it)
                return decode_attention(*x.args, plan=p)

            err = max_err(fn(), ref)
            assert err < 2e-2, f"{row.name()} {name}: wrong, err {err}"
            times.setdefault(name, []).append(do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3)
        plan.MHA_LONG_MIN_TOKENS = threshold
        label = row.name()
        log.write(json.dumps(dict(row=label, **{k: [round(t, 2) for t in v] for k, v in times.items()},
                                  plans=notes)) + "\n")  # fmt: skip
        log.flush()
        a, b = times["2-stage"], times["3-stage"]
        line = (f"{label:<32} 2-stage {' '.join(f'{t:6.1f}' for t in a)} ({notes['2-stage']:>4})  3-stage "
                f"{' '.join(f'{t:6.1f}' for t in b)} ({notes['3-stage']:>4})  {min(b) / min(a) - 1:+6.1%}")
        table.append(line)
        print(line, flush=True)
    print()
    print("\n".join(table))
    print()
    # what decides the programs per SM: registers per thread and shared memory of each compiled 128-token partial
    for (stages, warps), (regs, shared) in sorted(KERNELS.items()):
        print(f"partial kernel, 128 tokens: {stages} stages, {warps} warps, {regs} registers, {shared} B shared")


# (num_stages, num_warps) -> (registers, shared bytes) of the 128-token partial kernels launched
KERNELS = {}
_launch = triton_splitk.launch


def _noting(kernel, grid, *args, **kwargs):
    compiled = _launch(kernel, grid, *args, **kwargs)
    if kernel is triton_splitk._partial_kernel and kwargs.get("BLOCK_N") == 128 and compiled is not None:
        key = (kwargs.get("num_stages"), kwargs.get("num_warps"))
        KERNELS[key] = (getattr(compiled, "n_regs", None), getattr(compiled.metadata, "shared", None))
    return compiled


triton_splitk.launch = _noting

if __name__ == "__main__":
    main()
