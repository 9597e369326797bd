"""K/V load pipelining probe: tiles x stages on split-K and single-pass rows, for whichever flashdecode is on the
path (run it once per code version, with a tag). Graph µs, caches rotated out of L2, every variant checked against
the float64 reference first. Writes $OUT/pipeline-<tag>.jsonl and prints a table last.

    python scripts/pipeline_probe.py base
    PYTHONPATH=<patched tree>/src python scripts/pipeline_probe.py prefetch
    python scripts/pipeline_probe.py dims   # head_dim 64 and 256 tiles (64 x 4096 32/8), page ids prefetched or not
    python scripts/pipeline_probe.py fp8    # tiles for an fp8 cache (e4m3 / e5m2), against the bf16 default
    python scripts/pipeline_probe.py mha    # MHA rows (12/12, 32/32) with the page ids prefetched, against the default
    python scripts/pipeline_probe.py fp8reg # fp8 tiles under a register cap (maxnreg)
    python scripts/pipeline_probe.py occ    # head dim 256 and MHA tiles with more programs per SM (4 warps, a cap)
    python scripts/pipeline_probe.py addr   # grouped tiles of the leaner address code: waves of programs per SM
    python scripts/pipeline_probe.py fp8w   # the 128-token fp8 tile: register cap, 8 warps, stages, 256 tokens
    python scripts/pipeline_probe.py fp8f   # fp8 split rows as fixed splits with the 128-token tile
    python scripts/pipeline_probe.py fp8s   # ...the same bytes as a single pass over B sequences and as B splits
    python scripts/pipeline_probe.py fp8p   # the uncapped 128-token fp8 tile on split rows, planner targets 2-4
"""

import itertools
import os
import sys

import torch
from triton.testing import do_bench_cudagraph

import flashdecode
from flashdecode import triton_common, triton_splitk
from flashdecode.bench import FP8_K_SCALE, FP8_V_SCALE, ProbeLog, Row, _l2_bytes, quantize_kv, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense
from flashdecode.triton_common import Features
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


# (BLOCK_N, warps, stages, page ids one tile ahead) for head_dim 64 and 256
D64 = [(64, 4, 3, False), (64, 4, 3, True), (128, 4, 3, True), (128, 4, 2, False), (32, 4, 3, True), (128, 8, 3, True)]
D256 = [(32, 4, 3, False), (32, 4, 3, True), (32, 8, 3, True), (64, 8, 2, False), (64, 8, 3, True), (16, 4, 4, True)]
DIM_ROWS = [
    (Row([4096] * 64, 32, 8, head_dim=64), "single", D64), (Row([4096] * 64, 32, 8, head_dim=64), "split", D64),
    (Row([4096] * 64, 32, 8, head_dim=256), "single", D256), (Row([4096] * 64, 32, 8, head_dim=256), "split", D256),
    (Row([8192], 32, 8, head_dim=64), "split", D64), (Row([8192], 32, 8, head_dim=256), "split", D256),
]  # fmt: skip


# fp8 cache rows (scales as the benchmark's fp8 preset); None: the bf16 cache with its default tile, for scale
FP8 = [(64, 4, 3, False), (64, 4, 3, True), (32, 4, 3, True), (128, 4, 3, True), (128, 4, 2, False), (128, 8, 3, True),
       (64, 4, 4, True), (128, 4, 4, True), (256, 8, 2, False)]  # fmt: skip
FP8_ROWS = [
    (Row([4096] * 64, 32, 8), "single", [None]), (Row([4096] * 64, 32, 8, kv_dtype="e4m3"), "single", FP8),
    (Row([4096] * 64, 32, 8, kv_dtype="e5m2"), "single", FP8),
    (Row([65536], 12, 2), "split", [None]), (Row([65536], 12, 2, kv_dtype="e4m3"), "split", FP8),
]  # fmt: skip


# the fp8 tiles under a register cap (ptxas .maxnreg): at 128 tokens the single pass holds 2 programs per SM, limited
# by registers (ncu at 9179439: 8 warps per SM, issue slots 50% busy, DRAM 43%); 168 registers would admit a third
FP8_REG = [(128, 4, 3, True), (128, 4, 3, True, 168), (128, 4, 3, True, 128), (128, 4, 2, True, 168),
           (64, 4, 3, True, 128), (32, 4, 3, True)]  # fmt: skip
FP8_REG_ROWS = [
    (Row([4096] * 64, 32, 8, kv_dtype="e4m3"), "single", FP8_REG),
    (Row([65536], 12, 2, kv_dtype="e4m3"), "split", FP8_REG), (Row([131072], 32, 8, kv_dtype="e4m3"), "split", FP8_REG),
]  # fmt: skip
# ...and the short-chunk rows, PREFETCH_TILE against FP8_SPLIT_TILE (kept at 7d8c95d from the rows above)
FP8_SHORT = [(32, 4, 3, True), (64, 4, 3, True, 128)]
FP8_REG_ROWS += [
    (Row([2048] * 8, 28, 4, kv_dtype="e4m3"), "split", FP8_SHORT),
    (Row([2048], 28, 4, kv_dtype="e4m3"), "split", FP8_SHORT),
    (Row([4096] * 16, 12, 2, kv_dtype="e4m3"), "split", FP8_SHORT),
    (Row([1024] * 64, 12, 2, kv_dtype="e4m3"), "split", FP8_SHORT),
]  # fmt: skip
# the 128-token fp8 tile again after the 32-bit address arithmetic (199 registers, 2 programs per SM): a register
# cap for a third program, 8 warps, a 4th stage, 256 tokens
FP8W = [(128, 4, 3, True), (128, 4, 3, True, 168), (128, 8, 3, True), (256, 8, 3, True), (128, 4, 4, True),
        (128, 8, 4, True)]  # fmt: skip
FP8W_ROWS = [
    (Row([4096] * 64, 32, 8), "single", [None]), (Row([4096] * 64, 32, 8, kv_dtype="e4m3"), "single", FP8W),
    (Row([131072], 32, 8, kv_dtype="e4m3"), "split", FP8W),
    (Row([8192] * 128, 32, 8, kv_dtype="e4m3"), "single", FP8W[:3]),
]  # fmt: skip
# fp8 split-K rows as fixed splits ("fixed<S>": S splits a sequence, combine launch) with the single pass's 128-token
# tile (2 programs per SM) against FP8_SPLIT_TILE (64 tokens, capped at 128 registers: 4 per SM); "split": planned
FP8F = [(128, 4, 3, True), (64, 4, 3, True, 128)]
FP8F_ROWS = [
    (Row([131072], 32, 8, kv_dtype="e4m3"), mode, FP8F)
    for mode in ("split", "fixed16", "fixed32", "fixed33", "fixed64", "fixed66")
] + [(Row([65536], 12, 2, kv_dtype="e4m3"), mode, FP8F) for mode in ("split", "fixed64", "fixed66", "fixed128")]
# ...why fixed splits of the 128-token tile run at half the single pass's rate: the single pass over 16-64 sequences
# of 4096 tokens (B * 8 programs, 2 per SM) against one sequence of the same bytes cut into B fixed splits
FP8S_ROWS = [(Row([4096] * b, 32, 8, kv_dtype="e4m3"), "single", FP8F[:1]) for b in (16, 32, 33, 48, 64)] + [
    (Row([4096 * b], 32, 8, kv_dtype="e4m3"), f"fixed{b}", FP8F[:1]) for b in (16, 32, 33, 48, 64)
] + [(Row([8192] * 16, 32, 8, kv_dtype="e4m3"), "fixed2", FP8F[:1]), (Row([4096] * 32, 32, 8), "single", [None])]
# fp8f and fp8s ran the split modes' 128-token tile under FP8_SPLIT_TILE's cap of 128 registers (the probe kept
# split_config's maxnreg; ncu: 128 registers against the single pass's 199): the uncapped tile, planned with the
# planner aiming at 4 (as now), 2 or 3 programs per SM (the 6th field), and as fixed splits; None: FP8_SPLIT_TILE
FP8P = [None, (128, 4, 3, True, None), (128, 4, 3, True, None, 2), (128, 4, 3, True, None, 3)]
FP8P_ROWS = [
    (Row([131072], 32, 8, kv_dtype="e4m3"), "split", FP8P), (Row([65536], 12, 2, kv_dtype="e4m3"), "split", FP8P),
    (Row([16384] * 4, 32, 8, kv_dtype="e4m3"), "split", FP8P),
    (Row([4096] * 16, 12, 2, kv_dtype="e4m3"), "split", FP8P),
    (Row([2048] * 8, 28, 4, kv_dtype="e4m3"), "split", FP8P), (Row([2048], 28, 4, kv_dtype="e4m3"), "split", FP8P),
] + [(Row([131072], 32, 8, kv_dtype="e4m3"), m, FP8P[:2]) for m in ("fixed33", "fixed66")] + [
    (Row([65536], 12, 2, kv_dtype="e4m3"), m, FP8P[:2]) for m in ("fixed64", "fixed128")
]  # fmt: skip
# MHA and small-group tiles with and without the page ids one tile ahead (measured for groups of 4-16 only, where they
# paid); None: the default tile
MHA_P = [None, (128, 4, 2, True), (64, 4, 3, True), (64, 4, 4, True), (128, 8, 2, True), (32, 4, 4, True)]
MHA_ROWS = [
    (Row([1024] * 64, 12, 12), "single", MHA_P), (Row([256] * 256, 12, 12), "single", MHA_P),
    (Row([4096] * 16, 12, 12), "split", MHA_P), (Row([16384] * 4, 12, 12), "split", MHA_P),
    (Row([65536], 12, 12), "split", MHA_P), (Row([32768], 32, 32), "split", MHA_P),
]  # fmt: skip

# FlashInfer's kernels hold 2 (head dim 256, tensor cores: 4 warps, 74 KB, 248 registers) and 5-6 (MHA: 4 warps,
# 37 KB, 72 registers) programs per SM, where ours hold 1 (8 warps, 141 KB) and 3 (73 KB, 144 registers); ncu at
# e0de952 (sweeps/ncu-e0de952-*.txt). Tiles of their shape, and ours under a register cap
OCC_D256 = [None, (64, 4, 2, False), (64, 4, 2, True), (64, 4, 3, True), (32, 4, 2, False), (64, 8, 2, True),
            (64, 4, 2, False, 255)]  # fmt: skip
OCC_MHA = [None, (64, 4, 2, False, 96), (64, 4, 2, False, 128), (128, 4, 2, False, 128), (64, 8, 2, False),
           (32, 4, 2, False, 96)]  # fmt: skip
OCC_ROWS = [
    (Row([4096] * 64, 32, 8, head_dim=256), "single", OCC_D256), (Row([8192], 32, 8, head_dim=256), "split", OCC_D256),
    (Row([1024] * 64, 12, 12), "single", OCC_MHA), (Row([16384] * 4, 12, 12), "split", OCC_MHA),
    (Row([32768], 32, 32), "split", OCC_MHA),
]  # fmt: skip

# the grouped tiles after the leaner address code (unsigned page / row arithmetic, 32-bit offsets): the single pass's
# 32-token tile fell from 112 to 86 registers (sm_90 compile), 4 -> 5 programs per SM, and the 1024-program rows
# (1.94 waves of 4, 1.55 of 5) got slower; a 4th stage takes the shared memory of a 5th program back. The split rows:
# the fused merge's 64-token tile (110 -> 90 registers)
ADDR_GQA = [None, (32, 4, 4, True), (64, 4, 3, True), (32, 4, 3, False), (64, 4, 3, False)]
ADDR_ROWS = [
    (Row([8192] * 128, 32, 8), "single", ADDR_GQA), (Row([4096] * 128, 32, 8), "single", ADDR_GQA),
    (Row([4096] * 64, 32, 8), "single", ADDR_GQA), (Row([2048] * 256, 32, 8), "single", ADDR_GQA),
    (Row([4096] * 80, 32, 8), "single", ADDR_GQA), (Row([128] * 8, 28, 4), "single", ADDR_GQA),
    (Row([131072] + [1024] * 63, 32, 8), "split", ADDR_GQA), (Row([3064] * 64, 32, 8), "split", ADDR_GQA),
    (Row([2048] * 8, 28, 4), "split", ADDR_GQA),
]  # fmt: skip


def main():
    tag = sys.argv[1] if len(sys.argv) > 1 else "run"
    if os.environ.get("FP8_VIA_Q_DTYPE"):
        # the fp8 cache's products in q's dtype (the earlier path) rather than fp16
        triton_common.FP8_DOT_F16 = False
        tag += "-via-q-dtype"
    if os.environ.get("NO_CHAIN"):
        # each call's first kernel launched normally (triton_common.CHAIN_PDL)
        triton_common.CHAIN_PDL = False
        tag += "-nochain"
    if os.environ.get("NO_PDL"):
        # no programmatic dependent launch at all (triton_common.PDL)
        triton_common.PDL = False
        tag += "-nopdl"
    probes = {"dims": DIM_ROWS, "fp8": FP8_ROWS, "mha": MHA_ROWS, "fp8reg": FP8_REG_ROWS, "occ": OCC_ROWS,
              "addr": ADDR_ROWS, "fp8w": FP8W_ROWS, "fp8f": FP8F_ROWS,
              "fp8s": FP8S_ROWS, "fp8p": FP8P_ROWS}
    rows = probes.get(tag.split("-")[0], ROWS)
    log = ProbeLog(f"pipeline-{tag}")
    print(f"flashdecode from {os.path.dirname(flashdecode.__file__)}", flush=True)
    l2 = _l2_bytes("cuda")
    for row, mode, tiles in rows:
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, row.head_dim, 16, torch.bfloat16, "cuda",
                              spare_pages=0)  # fmt: skip
        features = Features()
        if row.kv_dtype:
            quantize_kv(c, row.kv_dtype)
            features = Features(kv_fp8=True, k_scale=FP8_K_SCALE, v_scale=FP8_V_SCALE)
            ref, _ = reference_dense(c.q, c.k_cache.float() * FP8_K_SCALE, c.v_cache.float() * FP8_V_SCALE,
                                     *c.args[3:], device="cuda")  # fmt: skip
        else:
            ref, _ = reference_dense(*c.args, device="cuda")
        copies = rotation_copies(c, l2)
        out = torch.empty_like(c.q)
        res, errs = {}, {}
        scale = row.head_dim**-0.5
        for tile in tiles:
            bn, warps, stages, *prefetch = tile or (0, 0, 0)
            cfg = dict(BLOCK_N=bn, num_warps=warps, num_stages=stages) if tile else {}
            if prefetch:
                cfg["PREFETCH_PAGES"] = prefetch[0]
            if tile:
                # a named tile is that tile: no register cap unless it names one (split_config's FP8_SPLIT_TILE
                # would otherwise keep its cap of 128 under a config that does not override it)
                cfg["maxnreg"] = prefetch[1] if len(prefetch) > 1 else None
            # ...and the planner's programs per SM for the planned mode, when the tile names one
            saturation = dict(triton_splitk.PLANNER_SATURATION)
            if len(prefetch) > 2:
                triton_splitk.PLANNER_SATURATION.update({k: prefetch[2] for k in saturation})
            it = itertools.cycle(copies)
            # "split": planned; "fixed<S>": S fixed splits
            splits = int(mode[5:]) if mode.startswith("fixed") else None
            if mode != "single":
                def fn():
                    return triton_splitk.decode_splitk(*next(it).args, scale, out, None, num_splits=splits, config=cfg,
                                                       features=features)  # fmt: skip
            else:
                def fn():
                    return decode_single(*next(it).args, scale, out, None, config=cfg, features=features)
            name = (f"{bn}/{warps}/{stages}" + ("/p" if prefetch and prefetch[0] else "")) if tile else "default"
            name += f"/r{prefetch[1]}" if len(prefetch) > 1 and prefetch[1] else ""
            name += f"/s{prefetch[2]}" if len(prefetch) > 2 else ""
            try:
                err = errs[name] = max_err(fn()[0], ref)
                assert err < 0.05, f"wrong: err {err}"
                res[name] = do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
            except Exception as e:  # noqa: BLE001 - a failing variant is reported, the probe goes on
                print(f"{row.name()} {mode} {name} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            triton_splitk.PLANNER_SATURATION.update(saturation)
        rec = dict(row=row.name(), mode=mode, tag=tag, **{k: round(v, 2) for k, v in res.items()},
                   max_err={k: float(v) for k, v in errs.items()})  # fmt: skip
        log.row(rec, f"{tag:<9} {mode:<6} {row.name():<16} " + "  ".join(f"{k} {v:6.1f}" for k, v in res.items()))
    log.close()


if __name__ == "__main__":
    main()
