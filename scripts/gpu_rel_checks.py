"""GPU reliability checks of scripts/gpu_rel.sh: 64-bit address math and bit-identical repeated calls.

    python scripts/gpu_rel_checks.py pool     # K and V pools of > 2^31 elements each, sequences' pages near the end
    python scripts/gpu_rel_checks.py repeat   # 1000 calls per backend, every output and LSE equal to the first

Each prints one ``RESULT <name> PASS|FAIL ...`` line and exits 1 on failure.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from flashdecode import decode_attention
from flashdecode.cases import random_paged_case
from flashdecode.check import check_output, lse_err, output_tolerance
from flashdecode.reference import reference_dense
from sanitize_cases import lse_tolerance

INT32_MAX = 2**31 - 1


def check_pool(num_kv_heads=8, head_dim=128, page_size=16, group=4) -> bool:
    """bf16 K and V of num_pages x page_size x Hkv x D > 2^31 elements each (~4.4 GB each). The sequences' pages
    are the last ones of the pool, one sequence straddles element 2^31, the rest of the pool is NaN. Checked
    against the float64 reference, gathered on the GPU from the used pages only."""
    per_page = page_size * num_kv_heads * head_dim
    boundary_page = 2**31 // per_page  # the first page whose elements lie past 2^31
    num_pages = boundary_page + 4096
    lens = [1, 700, 4000, 17, 0, 2500]
    pages_per_seq = [-(-n // page_size) for n in lens]
    gen = torch.Generator().manual_seed(0)
    # sequence 5 straddles element 2^31; the others take shuffled pages from the last 2000
    tail = (num_pages - 2000 + torch.randperm(2000, generator=gen)).tolist()
    first = boundary_page - pages_per_seq[5] // 2
    straddle = list(range(first, first + pages_per_seq[5]))
    width = max(pages_per_seq) + 2
    table = torch.full((len(lens), width), -1, dtype=torch.int32)
    for b, n in enumerate(pages_per_seq):
        table[b, :n] = torch.tensor(straddle if b == 5 else [tail.pop() for _ in range(n)], dtype=torch.int32)
    table = table.cuda()
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    v_cache = torch.full_like(k_cache, float("nan"))
    assert k_cache.numel() > INT32_MAX and k_cache.stride(0) * int(table.max()) > INT32_MAX
    used = table[table >= 0].long()
    k_cache[used] = torch.randn(len(used), page_size, num_kv_heads, head_dim, device="cuda").to(torch.bfloat16)
    v_cache[used] = torch.randn(len(used), page_size, num_kv_heads, head_dim, device="cuda").to(torch.bfloat16)
    q = torch.randn(len(lens), group * num_kv_heads, head_dim, device="cuda").to(torch.bfloat16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    args = (q, k_cache, v_cache, seqlens, table)
    print(f"pool: {num_pages} pages, {k_cache.numel() / 2**31:.3f} x 2^31 elements per cache "
          f"({k_cache.numel() * 2 / 1e9:.2f} GB each); highest page used {int(table.max())}, "
          f"element offset {int(table.max()) * k_cache.stride(0) / 2**31:.3f} x 2^31")  # fmt: skip
    ref_out, ref_lse = reference_dense(*args, device="cuda")
    tol, lse_tol = output_tolerance(args, ref_out), lse_tolerance(args, ref_lse)
    ok_all = True
    for backend, splits in (("triton", None), ("triton_splitk", None), ("triton_splitk", 4)):
        out, lse = decode_attention(*args, backend=backend, num_splits=splits, return_lse=True)
        ok, err = check_output(out, ref_out, tol)
        lerr = lse_err(lse, ref_lse)
        ok = ok and lerr <= lse_tol
        ok_all &= ok
        print(f"  {'ok  ' if ok else 'FAIL'} {backend:14s} splits={splits}: out err {err:.3g} (tol {tol:.3g}), "
              f"lse err {lerr:.3g} (tol {lse_tol:.3g})")  # fmt: skip
    verdict = "PASS" if ok_all else "FAIL"
    print(f"RESULT pool {verdict} pool of {k_cache.numel() / 2**31:.2f} x 2^31 elements, 3 backends")
    return ok_all


def check_repeat(calls=1000) -> bool:
    """Each backend called `calls` times on one ragged batch (into a fresh and into a reused buffer): every output
    and LSE equal (torch.equal) to the first call's."""
    c = random_paged_case([8192, 1, 0, 3000, 17, 5000, 129, 64], 32, 8, 128, 16, torch.bfloat16, "cuda", seed=1)
    ref_out, _ = reference_dense(*c.args, device="cuda")
    tol = output_tolerance(c.args, ref_out)
    ok_all = True
    for backend, splits in (("triton", None), ("triton_splitk", None), ("triton_splitk", 8), ("auto", None)):
        first, first_lse = decode_attention(*c.args, backend=backend, num_splits=splits, return_lse=True)
        ok, err = check_output(first, ref_out, tol)
        buffer = torch.empty_like(first)
        mismatches = 0
        start = time.time()
        for i in range(calls):
            out, lse = decode_attention(
                *c.args, backend=backend, num_splits=splits, return_lse=True, out=buffer if i % 2 else None
            )
            mismatches += not (torch.equal(out, first) and torch.equal(lse, first_lse))
        torch.cuda.synchronize()
        ok = ok and mismatches == 0
        ok_all &= ok
        mark = "ok  " if ok else "FAIL"
        print(f"  {mark} {backend:14s} splits={splits}: {calls} calls, {mismatches} differ from the "
              f"first; first vs reference err {err:.3g} (tol {tol:.3g}); {time.time() - start:.1f}s")  # fmt: skip
    print(f"RESULT repeat {'PASS' if ok_all else 'FAIL'} {calls} calls x 4 backends bit-identical")
    return ok_all


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=["pool", "repeat"])
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args(argv)
    ok = check_pool() if args.check == "pool" else check_repeat(args.calls)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
