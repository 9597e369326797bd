"""Correctness gate shared by the tests, ``flashdecode run`` and the benchmark.

A backend passes when its error against the float64 reference is at most twice the error of the same math done
by plain PyTorch (``torch_naive``) in the same precision, plus one ulp of the dtype at the output's scale, plus
the two fp32 roundings that the kernels' exp2 adds (``exp2_fold_term``).
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
    """2 x max error of ``torch_naive`` on the same inputs + one ulp of q's dtype at max |ref| + ``exp2_fold_term``."""
    from .api import decode_attention

    baseline = decode_attention(*args, backend="torch_naive", **kwargs)
    ulp = torch.finfo(args[0].dtype).eps * float(ref_out.abs().max().clamp_min(1.0)) if ref_out.numel() else 0.0
    fold = exp2_fold_term(args, kwargs.get("softmax_scale"), kwargs.get("softcap"), kwargs.get("alibi_slopes"))
    return 2 * max_err(baseline, ref_out) + ulp + fold


def exp2_fold_term(args, softmax_scale=None, softcap=None, alibi_slopes=None) -> float:
    """Output error the kernels' exp2 costs beyond plain PyTorch's exp: eps32 * max|logit| * max|v|.

    The kernels multiply each fp32 score by scale * log2(e) (itself rounded to fp32) and take exp2: two more fp32
    roundings than exp(score), each moving a softmax weight by at most eps/2 * |score| relative, so the output moves
    by at most eps32 * max|score| * max|v|. Negligible for ordinary logits (|score| ~ 10: ~1e-6 at |v| ~ 1); it
    matters in fp32 with large logits and for the -1e5 / +1e3 logits of the contract tests (found by the fuzzer and
    on the H200, docs/contracts.md). Valid tokens only, read like the reference does. The logit is the score capped
    at softcap and moved by an ALiBi bias of up to max|slope| * (L - 1) (the fuzzer found fp32 ALiBi rows over this
    bar while it counted the score alone)."""
    from .reference import gather_sequence

    q, k_cache, v_cache, lens, table = args[:5]
    q4 = q if q.dim() == 4 else q[:, None]
    if k_cache.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return 0.0  # fp8 caches: their tolerance comes from the dequantised reference
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    group = q4.shape[2] // k_cache.shape[2]
    max_score = max_v = max_bias = 0.0
    slope = float(alibi_slopes.abs().max()) if alibi_slopes is not None and alibi_slopes.numel() else 0.0
    for b, n in enumerate(lens.tolist()):
        if n:
            max_bias = max(max_bias, slope * (n - 1))
            k = gather_sequence(k_cache, table[b], n).double().repeat_interleave(group, dim=1)
            scores = torch.einsum("thd,lhd->thl", q4[b].double(), k) * scale
            max_score = max(max_score, float(scores.abs().max()))
            max_v = max(max_v, float(gather_sequence(v_cache, table[b], n).double().abs().max()))
    if softcap is not None:
        max_score = min(max_score, float(softcap))
    return torch.finfo(torch.float32).eps * (max_score + max_bias) * max_v


def check_output(out, ref_out, tolerance) -> tuple[bool, float]:
    """(passes, error) for an output against the reference."""
    err = max_err(out, ref_out)
    return err <= tolerance, err
