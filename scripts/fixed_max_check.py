"""The single pass and split-K with the max fixed at each row's first tile (FLASHDECODE_FIXED_MAX, read at import)
against the float64 reference, on 12/2 batches whose later tokens score far above the first tile: one key per
sequence turned to its query's direction, scores ~40 log2 units above the rest. With FLASHDECODE_FIXED_MAX=1 the
walk runs again with the online softmax there; with =2 (probe only) it does not, and an fp16 cache's p leaves
fp16's range. Prints one line per case and a count of failures.

    FLASHDECODE_FIXED_MAX=1 python scripts/fixed_max_check.py [cpu|cuda]
"""

import sys

import torch

from flashdecode import decode_attention, triton_common
from flashdecode.cases import random_paged_case
from flashdecode.check import max_err, output_tolerance
from flashdecode.reference import reference_dense


def spiked(c, boost):
    """Turn token len - 5 of each sequence of more than 40 tokens, in every KV head, to boost x its first query
    row's direction."""
    group = c.q.shape[1] // c.k_cache.shape[2]
    page_size = c.k_cache.shape[1]
    for b, n in enumerate(c.cache_seqlens.tolist()):
        if n > 40:
            t = n - 5
            page, row = int(c.block_table[b, t // page_size]), t % page_size
            for h in range(c.k_cache.shape[2]):
                qd = c.q[b, h * group].float()
                c.k_cache[page, row, h] = (qd / qd.norm() * boost).to(c.k_cache.dtype)
    return c


def main():
    device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    print("FIXED_MAX", bool(triton_common.FIXED_MAX), "walk again", bool(triton_common.FIXED_MAX_WALK_AGAIN))
    fails = 0
    lengths = [0, 1, 15, 16, 17, 200, 150, 3000]
    for dtype in (torch.float16, torch.bfloat16):
        for boost in (0.0, 40.0):
            for backend in ("triton", "triton_splitk", "auto"):
                c = random_paged_case(lengths, 12, 2, 128, 16, dtype, device, seed=3)
                if boost:
                    spiked(c, boost)
                ref = reference_dense(*c.args)[0]
                out = decode_attention(*c.args, backend=backend)
                err, tol = max_err(out, ref), output_tolerance(c.args, ref)
                ok = bool(err <= tol) and not bool(torch.isnan(out).any())
                fails += not ok
                print(f"{str(dtype):>14} boost {boost:>4} {backend:>13} err {err:.2e} tol {tol:.2e}",
                      "ok" if ok else "FAIL")
    print("failures", fails)


if __name__ == "__main__":
    main()
