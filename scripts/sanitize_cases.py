"""Small decode-attention configs for compute-sanitizer (scripts/gpu_rel.sh), each checked against float64.

Every case has NaN-poisoned spare pages, -1 and far-out-of-range ids in the block table past each sequence, and
ragged lengths with zeros; some also poison the rows past each sequence's end in its last page with Inf. Run it
plainly first (compiles the kernels into TRITON_CACHE_DIR), then under ``compute-sanitizer --tool memcheck`` with
PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that every tensor is its own allocation and a read past one is reported.

    python scripts/sanitize_cases.py [--only SUBSTRING ...] [--list]

Exit status 1 if any result is wrong (error above the tolerance of flashdecode.check, or a NaN).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from flashdecode import decode_attention
from flashdecode.cases import random_paged_case
from flashdecode.check import check_output, lse_err, output_tolerance
from flashdecode.reference import reference_dense

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# name: (lengths, Hq, Hkv, D, page_size, dtype, backend, num_splits, poison the stale tails)
CASES = {
    "single-gqa4-p16-bf16": ([0, 1, 15, 16, 17, 300], 16, 4, 128, 16, "bf16", "triton", None, False),
    "single-mha-p1-fp16": ([3, 0, 70], 4, 4, 64, 1, "fp16", "triton", None, True),
    "single-gqa7-p17-bf16": ([33, 0, 200], 14, 2, 128, 17, "bf16", "triton", None, True),
    "splitk-fixed3-gqa4-p16-fp16": ([0, 5, 150, 400], 16, 4, 128, 16, "fp16", "triton_splitk", 3, True),
    "splitk-fixed24-more-splits-than-pages-bf16": ([1, 40, 0], 8, 2, 64, 16, "bf16", "triton_splitk", 24, False),
    "splitk-planned-ragged-bf16": ([2000, 3, 0, 700], 32, 8, 128, 16, "bf16", "triton_splitk", None, True),
    "splitk-planned-gqa8-p17-fp16": ([1500, 0, 17], 16, 2, 128, 17, "fp16", "triton_splitk", None, False),
    "auto-fp32-p16": ([900, 0, 31], 8, 2, 64, 16, "fp32", "auto", None, True),
}


def lse_tolerance(args, ref_lse) -> float:
    """2 x the error of an fp32 PyTorch LSE (torch_sdpa's) on the same inputs + 4 fp32 ulps, as tests/helpers.py."""
    _, base_lse = decode_attention(*args, backend="torch_sdpa", return_lse=True)
    finite = ref_lse[torch.isfinite(ref_lse)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    return 2 * lse_err(base_lse, ref_lse) + 4 * torch.finfo(torch.float32).eps * (1 + scale)


def run_case(seed: int, spec, device: str = "cuda") -> tuple[bool, str]:
    lens, hq, hkv, d, page, dname, backend, splits, stale = spec
    c = random_paged_case(lens, hq, hkv, d, page, DTYPES[dname], device, seed=seed)
    if stale:
        for b, n in enumerate(lens):
            if n % page:
                last = int(c.block_table[b, n // page])
                c.k_cache[last, n % page :] = float("inf")
                c.v_cache[last, n % page :] = float("-inf")
    out = torch.full_like(c.q, float("nan"))
    _, lse = decode_attention(*c.args, backend=backend, num_splits=splits, out=out, return_lse=True)
    if device == "cuda":
        torch.cuda.synchronize()
    # the check runs on CPU copies: fewer kernels for the sanitizer to instrument
    args = tuple(t.cpu() for t in c.args)
    ref_out, ref_lse = reference_dense(*args)
    ok, err = check_output(out, ref_out, output_tolerance(args, ref_out))
    lse_tol, lerr = lse_tolerance(args, ref_lse), lse_err(lse, ref_lse)
    return ok and lerr <= lse_tol, f"out err {err:.3g}, lse err {lerr:.3g} (tolerance {lse_tol:.3g})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="run the cases whose name contains one of these")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--device", default="cuda", help="cpu runs the kernels in the Triton interpreter")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    names = [n for n in CASES if args.only is None or any(s in n for s in args.only)]
    if args.list:
        print("\n".join(names))
        return 0
    failed = 0
    for name in names:
        start = time.time()
        ok, detail = run_case(list(CASES).index(name), CASES[name], args.device)
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name:48s} {detail} ({time.time() - start:.1f}s)", flush=True)
    print(f"RESULT sanitize_cases {'PASS' if not failed else 'FAIL'} {len(names) - failed}/{len(names)} cases correct")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
