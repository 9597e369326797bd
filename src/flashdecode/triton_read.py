"""The plainest fast read of a tensor: the benchmark's read ceiling (its "% peak" column and bound µs).

Each program sums BLOCK contiguous elements loaded by one ``tl.load`` and writes one fp32 partial sum; the
programs, many more than the GPU holds at once, are dealt out by the hardware as slots free, so no SM waits for a
slow one. Bytes: reads the whole tensor once, writes 4 bytes a program. Grid: (ceil(numel / BLOCK),).

On the H200 the same kernel (unmasked, in scripts/read_floor_probe.py) read 64 MiB in 16.0-16.7 µs (4574-4584 GB/s
over 32-128 MiB, 1.92 µs fixed), and this module 4 GiB at 4630 GB/s, where ``torch.sum`` reads 4 GiB at 4.08-4.22
TB/s, slower than the decode kernels' best rows (docs/benchmarks/h200-2026-11-30: read-floor-e8e144f,
read-ceiling-a58e992). Its PyTorch mirror is ``x.float().sum()``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import cdiv

__all__ = ["read_sum", "read_partials"]

# elements a program: 16 KB of bf16, 8 warps (64 bytes a thread in flight); the best of 4-64 KB at 4-16 warps
BLOCK = 8192
NUM_WARPS = 8


@triton.jit
def _read_sum_kernel(X, PARTIAL, numel, BLOCK: tl.constexpr):
    # program p: elements [p * BLOCK, (p + 1) * BLOCK) of the flat tensor, masked past numel, summed in fp32
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < numel, other=0.0)
    tl.store(PARTIAL + tl.program_id(0), tl.sum(x.to(tl.float32), axis=0))


def read_sum(x: torch.Tensor, partial: torch.Tensor | None = None) -> torch.Tensor:
    """The fp32 sum of a contiguous tensor, read once at the GPU's streaming rate.

    Args:
        x: any shape, contiguous, a floating dtype.
        partial: optional fp32 buffer of at least ceil(numel / BLOCK) elements for the programs' partial sums
            (reused across calls when timing).

    Returns:
        A 0-d fp32 tensor on x's device.

    Example:
        >>> device = "cuda" if torch.cuda.is_available() else "cpu"  # on a CPU, under TRITON_INTERPRET=1
        >>> read_sum(torch.ones(10000, device=device)).item()
        10000.0
    """
    return read_partials(x, partial).sum()


def read_partials(x: torch.Tensor, partial: torch.Tensor | None = None) -> torch.Tensor:
    """The read alone (what the benchmark times): [ceil(numel / BLOCK)] fp32 partial sums of a contiguous tensor."""
    assert x.is_contiguous(), "read_partials reads a contiguous tensor"
    programs = max(1, cdiv(x.numel(), BLOCK))
    if partial is None:
        partial = torch.empty(programs, device=x.device, dtype=torch.float32)
    assert partial.dtype == torch.float32 and partial.is_contiguous() and partial.numel() >= programs, (
        "partial: contiguous fp32, one element a program"
    )
    _read_sum_kernel[(programs,)](x, partial, x.numel(), BLOCK=BLOCK, num_warps=NUM_WARPS)
    return partial[:programs]
