"""Shared by the feature tests: run a backend on NaN-filled buffers and hold it to the float64 reference."""

import torch
from helpers import lse_err, max_err

from flashdecode import decode_attention
from flashdecode.check import output_tolerance
from flashdecode.reference import reference_dense

# (backend, num_splits): single pass, fixed splits (more splits than pages for the short sequences), planned
RUNS = [("triton", None), ("triton_splitk", 3), ("triton_splitk", None)]
RUN_IDS = ["single", "splits3", "planned"]


def lse_tolerance(args, ref_lse, **kw):
    """2 x the LSE error of torch_naive on fp32 copies of the inputs (fp8 pages dequantised) + 4 fp32 ulps."""
    q, k, v = args[:3]
    ks, vs = kw.pop("k_scale", None), kw.pop("v_scale", None)
    k32 = k.float() * (1.0 if ks is None else float(ks.reshape(()) if torch.is_tensor(ks) else ks))
    v32 = v.float() * (1.0 if vs is None else float(vs.reshape(()) if torch.is_tensor(vs) else vs))
    _, baseline = decode_attention(q.float(), k32, v32, *args[3:], backend="torch_naive", return_lse=True, **kw)
    finite = torch.isfinite(ref_lse)
    scale = float(ref_lse[finite].abs().max()) if finite.any() else 0.0
    return 2 * lse_err(baseline, ref_lse) + 4 * torch.finfo(torch.float32).eps * (1.0 + scale)


def check(args, backend, num_splits, **kw):
    """Run one backend with a NaN-filled output buffer and assert out and lse match the float64 reference."""
    ref_out, ref_lse = reference_dense(*args, **kw)
    out = torch.full_like(args[0], float("nan"))
    got, lse = decode_attention(*args, backend=backend, num_splits=num_splits, out=out, return_lse=True, **kw)
    assert got.data_ptr() == out.data_ptr() and lse.shape == args[0].shape[:-1]
    err, tol = max_err(out, ref_out), output_tolerance(args, ref_out, **kw)
    assert err <= tol, f"{backend}/{num_splits}: max |out - ref| = {err:.3g} > {tol:.3g}"
    err, tol = lse_err(lse, ref_lse), lse_tolerance(args, ref_lse, **dict(kw))
    assert err <= tol, f"{backend}/{num_splits}: max |lse - ref| = {err:.3g} > {tol:.3g}"
    return out, lse
