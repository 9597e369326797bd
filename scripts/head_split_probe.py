"""Does cutting a KV head's query rows over several programs beat cutting its tokens? (graph µs, caches rotated)

A GQA row with few sequences fills the GPU by splitting each sequence's tokens (split-K), which costs partial
stores, a counter and a merge. The other way to get more programs: the single pass with ``HEAD_ROWS`` query rows a
program (``group / HEAD_ROWS`` programs per KV head, adjacent in the grid), each reading the KV head's tokens and
writing its rows' final output. DRAM reads stay once only if the programs of one KV head run together and the later
ones find the tokens in L2; the L2 serves the tokens ``group / HEAD_ROWS`` times. This probe times, per row, the
plan, the single pass and each head split, with the 32- and 64-token prefetching tiles. Run on the GPU machine:

    python scripts/head_split_probe.py > head_split.log
"""

import itertools

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, plan_decode
from flashdecode.bench import _l2_bytes, rotation_copies
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err
from flashdecode.reference import reference_dense
from flashdecode.triton_common import PREFETCH_ONE_WAVE_TILE, PREFETCH_TILE
from flashdecode.triton_single import decode_single

# (lengths, Hq, Hkv)
ROWS = [
    ([256] * 256, 12, 2), ([1024] * 64, 12, 2), ([4096] * 16, 12, 2), ([16384] * 4, 12, 2), ([2048], 28, 4),
    ([2048] * 8, 28, 4), ([1024] * 24, 28, 4), ([128] * 8, 28, 4), ([4096] * 64, 32, 8), ([2048] * 40, 32, 8),
]  # fmt: skip


def time_us(fn, rotated):
    cycle = itertools.cycle(rotated)
    return do_bench_cudagraph(lambda: fn(next(cycle)), rep=50, return_mode="median") * 1e3


def main():
    print(f"{'row':>16} {'variant':>22} {'programs':>8} {'µs':>7}")
    for lens, hq, hkv in ROWS:
        case = random_paged_case(lens, hq, hkv, 128, 16, torch.bfloat16, "cuda", spare_pages=0, seed=0)
        ref, _ = reference_dense(*case.args, device="cuda")
        rotated = rotation_copies(case, _l2_bytes("cuda"))
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        name = f"{len(lens)}x{lens[0]} {hq}/{hkv}"
        group, batch = hq // hkv, len(lens)
        out = torch.empty_like(case.q)

        def single(c, cfg):
            return decode_single(c.q, c.k_cache, c.v_cache, c.cache_seqlens, c.block_table, 128**-0.5, out,
                                 config=cfg)[0]  # fmt: skip

        variants = [(f"plan S={plan.num_splits}", None, lambda c: decode_attention(*c.args, plan=plan))]
        for rows in sorted({group} | {r for r in (1, 2, 3, 4) if r < group}, reverse=True):
            blocks = -(-group // rows)
            for tile_name, tile in (("t32", PREFETCH_TILE), ("t64", PREFETCH_ONE_WAVE_TILE)):
                cfg = dict(tile, HEAD_ROWS=rows if rows < group else 0)
                label = f"rows {rows} x{blocks} {tile_name}"
                variants.append((label, batch * hkv * blocks, lambda c, cfg=cfg: single(c, cfg)))
        for label, programs, fn in variants:
            err = max_err(fn(case), ref)
            assert err < 2e-2, (name, label, err)
            print(f"{name:>16} {label:>22} {programs or '':>8} {time_us(fn, rotated):7.1f}", flush=True)


if __name__ == "__main__":
    main()
