"""Correctness gate shared by the tests, ``flashdecode run`` and the benchmark.

A backend passes when its error against the float64 reference is at most twice the error of the same math done
by plain PyTorch (``torch_naive``) in the same precision, plus one ulp of the dtype at the output's scale.
"""

from __future__ import annotations

import torch

__all__ = ["max_err", "lse_err", "output_tolerance", "check_output"]


def max_err(x, ref) -> float:
    """max |x - ref| in float64 on the CPU; any NaN counts as infinitely wrong."""
    diff = (x.double().cpu() - ref.double().cpu()).abs()
    if torch.isnan(diff).any():
        return float("inf")
    return float(diff.max()) if diff.numel() else 0.0


def lse_err(x, ref) -> float:
    """Like ``max_err`` over the finite entries; -inf in one and not the other is infinitely wrong."""
    x, ref = x.double().cpu(), ref.double().cpu()
    if not torch.equal(torch.isneginf(x), torch.isneginf(ref)):
        return float("inf")
    finite = torch.isfinite(ref)
    return max_err(x[finite], ref[finite])


def output_tolerance(args, ref_out, **kwargs) -> float:
    """2 x max error of ``torch_naive`` on the same inputs + one ulp of q's dtype at max |ref|."""
    from .api import decode_attention

    baseline = decode_attention(*args, backend="torch_naive", **kwargs)
    ulp = torch.finfo(args[0].dtype).eps * float(ref_out.abs().max().clamp_min(1.0)) if ref_out.numel() else 0.0
    return 2 * max_err(baseline, ref_out) + ulp


def check_output(out, ref_out, tolerance) -> tuple[bool, float]:
    """(passes, error) for an output against the reference."""
    err = max_err(out, ref_out)
    return err <= tolerance, err
