"""`auto` on MHA rows with the prefetching MHA tile (triton_splitk.MHA_PREFETCH_TILE) in every planned call of one
query row a KV head at head dim 128, against the library as it is (only plan_decode's long fixed splits take it),
alternated twice in one process (A B A B). Graph µs, caches rotated out of L2, each variant checked against the
float64 reference first. Rows: the anchor grid's MHA rows, MHA rows in 131072-token tables (`bench --preset
tables`, where `auto` sizes its cut from the capacity), short and many-head rows. Writes $OUT/mha-auto.jsonl, prints
a table last.

    python scripts/mha_auto_probe.py
"""

import itertools
import json
import os
from unittest.mock import patch

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, launcher, triton_splitk
from flashdecode.bench import Row, _l2_bytes, rotation_copies
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


def main():
    out_dir = os.environ.get("OUT", ".")
    log = open(os.path.join(out_dir, "mha-auto.jsonl"), "w")
    l2 = _l2_bytes("cuda")
    table = []
    for row, extra in ROWS:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[row.dtype]
        c = random_paged_case(row.seqlens, row.num_q_heads, row.num_kv_heads, row.head_dim, 16, dtype, "cuda",
                              spare_pages=0, extra_table_columns=extra)  # fmt: skip
        ref, _ = reference_dense(*c.args, device="cuda")
        copies = rotation_copies(c, l2)
        times = {"library": [], "prefetch": []}
        for name in ("library", "prefetch") * 2:
            launcher.clear()
            with patch.object(triton_splitk, "split_config",
                              prefetching_split_config if name == "prefetch" else _split_config):  # fmt: skip
                it = itertools.cycle(copies)

                def fn():
                    return decode_attention(*next(it).args)

                err = max_err(fn(), ref)
                assert err < 2e-2, f"{row.name()} {name}: wrong, err {err}"
                times[name].append(do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3)
        launcher.clear()
        label = row.name() + (f" T{c.block_table.shape[1] * 16}" if extra > 2 else "")
        log.write(json.dumps(dict(row=label, **{k: [round(t, 2) for t in v] for k, v in times.items()})) + "\n")
        log.flush()
        a, b = times["library"], times["prefetch"]
        line = (f"{label:<32} library {' '.join(f'{t:6.1f}' for t in a)}  prefetch {' '.join(f'{t:6.1f}' for t in b)}"
                f"  {min(b) / min(a) - 1:+6.1%}")  # fmt: skip
        table.append(line)
        print(line, flush=True)
    print()
    print("\n".join(table))


if __name__ == "__main__":
    main()
