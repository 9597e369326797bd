"""merge_states: combine two attention results over disjoint key sets by their log-sum-exp.

If (out_a, lse_a) is attention over keys A and (out_b, lse_b) over keys B (disjoint), attention over A ∪ B is

    lse = log(exp(lse_a) + exp(lse_b)),    out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

evaluated relative to m = max(lse_a, lse_b) so no exp overflows. This is the flash-decoding combine as a public
op (used for context parallelism and prefix/suffix caches). Bytes: reads both sides once, writes one.

Parts computed by ``decode_attention`` merge into the whole call's result when each part's logits are the whole
call's: q_len = 1 with no window and no ALiBi (each call places its query at its own last position), sinks given to
one part only (docs/features.md, "Features and merge_states"). LSEs are natural logs; FlashInfer's wrappers return
base-2 LSEs by default: multiply those by ln 2 before merging them with these.
"""

from __future__ import annotations

import math

import torch

__all__ = ["merge_states"]


def merge_states(out_a, lse_a, out_b, lse_b):
    """Merge two partial attention results.

    Args:
        out_a, out_b: [..., D] (e.g. [B, Hq, D]) in fp16, bf16 or fp32, same shape, dtype and device.
        lse_a, lse_b: [...] float32 natural-log LSEs (e.g. [B, Hq]; a base-2 LSE times ln 2); -inf marks an empty
            side.

    Returns:
        (out [..., D] in out_a's dtype, lse [...] float32). An empty side contributes nothing (its out may hold
        anything, NaN included); both empty give out = 0 and lse = -inf, never NaN.

    Example:
        >>> import torch, flashdecode
        >>> o1, o2 = torch.ones(1, 2, 4), torch.zeros(1, 2, 4)
        >>> l1, l2 = torch.zeros(1, 2), torch.zeros(1, 2)
        >>> out, lse = flashdecode.merge_states(o1, l1, o2, l2)
        >>> out[0, 0].tolist(), round(lse[0, 0].item(), 6)
        ([0.5, 0.5, 0.5, 0.5], 0.693147)
    """
    _check_pair("out_a", out_a, "lse_a", lse_a)
    _check_pair("out_b", out_b, "lse_b", lse_b)
    if out_a.shape != out_b.shape or out_a.dtype != out_b.dtype or out_a.device != out_b.device:
        raise ValueError(
            f"out_a and out_b must match in shape, dtype and device, got {tuple(out_a.shape)} {out_a.dtype} "
            f"{out_a.device} and {tuple(out_b.shape)} {out_b.dtype} {out_b.device}"
        )
    m = torch.maximum(lse_a, lse_b)
    # both sides empty: measure from 0 so that exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN
    m = torch.where(torch.isneginf(m), 0.0, m)
    w_a = torch.exp(lse_a - m)
    w_b = torch.exp(lse_b - m)
    total = w_a + w_b
    empty = total == 0
    num = torch.where(w_a[..., None] > 0, w_a[..., None] * out_a.float(), 0.0)
    num = num + torch.where(w_b[..., None] > 0, w_b[..., None] * out_b.float(), 0.0)
    out = num / torch.where(empty, 1.0, total)[..., None]
    lse = torch.where(empty, -math.inf, m + torch.log(torch.where(empty, 1.0, total)))
    return out.to(out_a.dtype), lse


def _check_pair(out_name, out, lse_name, lse):
    for name, t in ((out_name, out), (lse_name, lse)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if out.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"{out_name} must be float16, bfloat16 or float32, got {out.dtype}")
    if lse.dtype != torch.float32:
        raise TypeError(f"{lse_name} must be float32, got {lse.dtype}")
    if out.dim() < 1:
        raise ValueError(f"{out_name} must have at least one dim (the head dim, last), got a 0-d tensor")
    if tuple(lse.shape) != tuple(out.shape[:-1]):
        raise ValueError(
            f"{lse_name} must have shape {tuple(out.shape[:-1])} (= {out_name}.shape[:-1]), got {tuple(lse.shape)}"
        )
    if lse.device != out.device:
        raise ValueError(f"{lse_name} must be on {out_name}'s device {out.device}, got {lse.device}")
