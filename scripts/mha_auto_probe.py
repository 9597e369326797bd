"""`auto` on MHA rows with the prefetching MHA tile (triton_splitk.MHA_PREFETCH_TILE) in every planned call of one
query row a KV head at head dim 128, against the library as it is (only plan_decode's long fixed splits take it),
alternated twice in one process (A B A B). Graph µs, caches rotated out of L2, each variant checked against the
float64 reference first. Rows: the anchor grid's MHA rows, MHA rows in 131072-token tables (`bench --preset
tables`, where `auto` sizes its cut from the capacity), short and many-head rows. Writes $OUT/mha-auto.jsonl, prints
a table last.

    python scripts/mha_auto_probe.py                       (library against prefetch)
    MHA_AUTO_VARIANTS=library,prefetch4,prefetch3x python scripts/mha_auto_probe.py

Variants: ``prefetch`` keeps the "mha" class's planner target of 3 programs per SM, which the launch cannot enforce on
this 19 KB kernel (``launcher.cap_programs_per_sm`` would pad it past 48 KB, which needs a per-kernel opt-in the
kernel lacks), so a planned grid's programs with work may pile onto fewer SMs. ``prefetch4`` aims the planner at 4
(padding to ~45 KB enforces it); ``prefetch3x`` keeps 3 and opts the kernel in to the padding
(``cuFuncSetAttribute``, MAX_DYNAMIC_SHARED_SIZE_BYTES, through ctypes).
"""

import ctypes
import itertools
import os
from unittest.mock import patch

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, launcher, triton_splitk
from flashdecode.bench import ProbeLog, Row, _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense

# (row, block-table columns beyond the longest sequence: 131072-token tables as `bench --preset tables`)
ROWS = [
    (Row([65536], 12, 12), 2), (Row([16384] * 4, 12, 12), 2), (Row([4096] * 16, 12, 12), 2),
    (Row([1024] * 64, 12, 12), 2), (Row([256] * 256, 12, 12), 2), (Row([131072], 12, 12), 2),
    (Row([512], 12, 12), 8192 - 32), (Row([1024] * 4, 12, 12), 8192 - 64), (Row([1024] * 16, 12, 12), 8192 - 64),
    (Row([4096] * 16, 12, 12), 8192 - 256), (Row([2048], 12, 12), 2), (Row([8192] * 2, 12, 12), 2),
    (Row([32768], 40, 40), 2), (Row([16384] * 4, 12, 12, dtype="fp16"), 2), (Row([4096] * 16, 12, 12, head_dim=64), 2),
]  # fmt: skip
_split_config = triton_splitk.split_config


def prefetching_split_config(head_dim, group, dtype, q_len, kv_itemsize, num_kv_heads, fused, long_tile=False,
                             merged_fixed=False):  # fmt: skip
    """split_config with MHA_PREFETCH_TILE for every "mha" class call of one row at head dim 128, 16-bit cache."""
    cfg, saturation, tile = _split_config(head_dim, group, dtype, q_len, kv_itemsize, num_kv_heads, fused, long_tile,
                                          merged_fixed)  # fmt: skip
    if tile == "mha" and kv_itemsize == 2 and triton_splitk.mha_long_tile(cfg["BLOCK_D"], q_len * group) is (
        triton_splitk.MHA_PREFETCH_TILE
    ):
        cfg = {**cfg, **triton_splitk.MHA_PREFETCH_TILE}
    return cfg, saturation, tile


def prefetching_split_config_4(*args, **kwargs):
    """prefetching_split_config with the planner aiming at 4 programs per SM for the prefetching tile."""
    cfg, saturation, tile = prefetching_split_config(*args, **kwargs)
    if tile == "mha" and triton_splitk.uses_tile(cfg, triton_splitk.MHA_PREFETCH_TILE):
        saturation = 4
    return cfg, saturation, tile


_original_cap = launcher.cap_programs_per_sm


def cap_with_opt_in(compiled, programs):
    """launcher.cap_programs_per_sm, opting the kernel in to dynamic shared memory past 48 KB first where the padding
    needs it."""
    meta = getattr(compiled, "packed_metadata", None)
    if meta is not None and len(meta) == 3:
        from triton.runtime import driver

        props = driver.active.utils.get_device_properties(driver.active.get_current_device())
        shared = launcher.padded_shared_memory(compiled.metadata.shared, programs, props["max_shared_mem"] + 1024)
        if shared > 48 * 1024 >= compiled.metadata.shared:
            compiled._init_handles()
            cuda = ctypes.CDLL("libcuda.so.1")
            rc = cuda.cuFuncSetAttribute(ctypes.c_void_p(compiled.function), 8, ctypes.c_int(shared))
            assert rc == 0, f"cuFuncSetAttribute: CUresult {rc}"
            compiled.packed_metadata = (meta[0], meta[1], shared)
            return True
    return _original_cap(compiled, programs)


# name: (split_config, cap_programs_per_sm)
VARIANTS = {
    "library": (_split_config, _original_cap),
    "prefetch": (prefetching_split_config, _original_cap),
    "prefetch4": (prefetching_split_config_4, _original_cap),
    "prefetch3x": (prefetching_split_config, cap_with_opt_in),
}


def main():
    log = ProbeLog("mha-auto")
    l2 = _l2_bytes("cuda")
    for row, extra in ROWS:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[row.dtype]
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, row.head_dim, 16, dtype, "cuda",
                              spare_pages=0, extra_table_columns=extra)  # fmt: skip
        ref, _ = reference_dense(*c.args, device="cuda")
        copies = rotation_copies(c, l2)
        names = os.environ.get("MHA_AUTO_VARIANTS", "library,prefetch").split(",")
        times = {name: [] for name in names}
        for name in names * 2:
            launcher.clear()
            launcher._capped.clear()
            config, cap = VARIANTS[name]
            with patch.object(triton_splitk, "split_config", config), patch.object(launcher, "cap_programs_per_sm", cap):
                it = itertools.cycle(copies)

                def fn():
                    return decode_attention(*next(it).args)

                err = max_err(fn(), ref)
                assert err < 2e-2, f"{row.name()} {name}: wrong, err {err}"
                times[name].append(do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3)
        launcher.clear()
        label = row.name() + (f" T{c.block_table.shape[1] * 16}" if extra > 2 else "")
        base = min(times[names[0]])
        line = f"{label:<32}" + "".join(
            f"  {n} {' '.join(f'{t:6.1f}' for t in v)} ({min(v) / base - 1:+5.1%})" for n, v in times.items()
        )
        log.row(dict(row=label, **{k: [round(t, 2) for t in v] for k, v in times.items()}), line)
    log.close()


if __name__ == "__main__":
    main()
