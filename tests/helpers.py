"""Tolerances derived from what plain PyTorch achieves at the same precision, and a case builder."""

import torch

from flashdecode import decode_attention
from flashdecode.cases import random_paged_case
from flashdecode.check import lse_err, max_err  # noqa: F401 (re-exported for the tests)
from flashdecode.check import output_tolerance as _output_tolerance
from flashdecode.reference import reference_dense

# Triton backends under test, and the plain-PyTorch backend whose error sets the bar
KERNEL_BACKENDS = ("triton", "triton_splitk", "auto")
ALL_BACKENDS = ("torch_naive", "torch_sdpa") + KERNEL_BACKENDS


def ragged_lengths(page_size, long=150):
    """Lengths that hit every edge: empty, one token, page-1, page, page+1, several pages, many tiles."""
    return [0, 1, max(page_size - 1, 1), page_size, page_size + 1, 3 * page_size + 5, long]


def case(seqlens, hq, hkv, d, page, dtype, device, seed=0, **kw):
    return random_paged_case(seqlens, hq, hkv, d, page, dtype, device, seed=seed, **kw)


def output_tolerance(c, ref_out, dtype, **kwargs):
    """2 x the error of torch_naive (the same math in plain PyTorch, same dtype) + one ulp at the output's scale."""
    assert c.q.dtype == dtype
    return _output_tolerance(c.args, ref_out, **kwargs)


def lse_tolerance(c, ref_lse, **kwargs):
    """2 x the error of an fp32 PyTorch LSE on the same low-precision inputs + 4 fp32 ulps at the LSE's scale."""
    _, baseline = decode_attention(*c.args, backend="torch_sdpa", return_lse=True, **kwargs)
    finite = torch.isfinite(ref_lse)
    scale = float(ref_lse[finite].abs().max()) if finite.any() else 0.0
    return 2 * lse_err(baseline, ref_lse) + 4 * torch.finfo(torch.float32).eps * (1.0 + scale)


def reference_of(c, **kwargs):
    return reference_dense(*c.args, **kwargs)


def planned_saturation(c, q_len=1):
    """The programs per SM the split-K planner aims at for case c's tile (what ``chunk_plan`` must be given to cut
    as the kernel does)."""
    from flashdecode.triton_splitk import split_config

    hkv, d = c.k_cache.shape[2], c.q.shape[-1]
    group = c.q.shape[-2] // hkv
    return split_config(d, group, c.q.dtype, q_len, c.k_cache.element_size(), hkv, False)[1]


def check_planned_partials(c, chunks, out, lse, o_part, lse_part, scale, head_dim):
    """A planned run against the float64 mirror: a long sequence cut into several chunks, the short ones whole
    (seq 0 one chunk, the empty seq 3 one empty chunk); each multi-chunk partial and LSE matches the mirror (single-chunk sequences go
    straight to ``out`` and leave their partial rows unset), and the final output and LSE match the reference."""
    from flashdecode.triton_splitk import splitk_partials_mirror

    per_seq = [sum(1 for b, _, _ in chunks if b == s) for s in range(c.q.shape[0])]
    assert per_seq[1] > 1 and per_seq[0] == 1 and per_seq[3] == 1
    ref_o, ref_lse = splitk_partials_mirror(*c.args, scale, chunks)
    # the grid has more chunk slots than chunks; the plan fills the first len(chunks)
    multi = torch.tensor([per_seq[b] > 1 for b, _, _ in chunks])
    o_part, lse_part = o_part[: len(chunks)], lse_part[: len(chunks)]
    assert lse_err(lse_part[multi], ref_lse[multi]) <= 1e-5
    assert max_err(o_part[multi][..., :head_dim], ref_o[multi]) <= 1e-5
    ref_out, ref_lse_all = reference_dense(*c.args, softmax_scale=scale)
    assert max_err(out, ref_out) <= 1e-5 and lse_err(lse, ref_lse_all) <= 1e-5
