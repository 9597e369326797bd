"""Property-based fuzzing of decode_attention against the float64 reference (case descriptions: strategies.py).

For every drawn case: the output matches ``reference_dense`` within the derived tolerance (2 x plain PyTorch's
error at the same precision + 1 ulp), the LSE within its tolerance, empty sequences give exactly 0 and -inf, the
result is written into ``out`` when one is given and nothing outside it changes.

CI runs the bounded, derandomised "ci" profile (tests/conftest.py loads it); ``make fuzz`` runs the "fuzz" profile
(thousands of random examples) and prints how many ran. A failure prints the drawn Spec, which ``build`` turns
back into the same tensors.
"""

import pytest
import torch
from helpers import lse_err, lse_tolerance, max_err
from hypothesis import given
from hypothesis import strategies as st
from strategies import DTYPES, FUZZ_BACKENDS, build, count_example, specs

from flashdecode import decode_attention
from flashdecode.cases import PagedCase
from flashdecode.check import output_tolerance
from flashdecode.reference import reference_dense


@pytest.mark.parametrize("backend", FUZZ_BACKENDS)
@given(data=st.data())
def test_decode_attention_matches_reference(backend, data):
    spec = data.draw(specs(backend), label="spec")
    count_example(f"test_decode_attention_matches_reference[{backend}]")
    call = build(spec)
    plain = PagedCase(*call.plain)
    result = decode_attention(*call.args, **call.kwargs)
    out, lse = result if spec.return_lse else (result, None)
    if call.kwargs["out"] is not None:
        assert out is call.kwargs["out"]
    out3 = out[:, 0] if out.dim() == 4 else out

    ref_out, ref_lse = reference_dense(*plain.args, softmax_scale=spec.softmax_scale)
    tol = output_tolerance(plain.args, ref_out, softmax_scale=spec.softmax_scale)
    if backend == "torch_sdpa":
        # a baseline, not a kernel of ours: on a GPU, SDPA picks its own fused algorithm (as in test_backends.py)
        tol *= 2
    err = max_err(out3, ref_out)
    assert err <= tol, f"{spec.id}: max |out - ref| = {err:.3g} > tolerance {tol:.3g}"

    empty = torch.tensor(spec.seqlens, dtype=torch.int64) == 0
    assert torch.equal(out3[empty].cpu(), torch.zeros_like(out3[empty].cpu())), f"{spec.id}: empty sequence not 0"
    if lse is not None:
        assert lse.shape == ref_lse.shape and lse.dtype == torch.float32
        if backend == "torch_naive":
            # its scores are rounded to the input dtype before the logsumexp (as in test_backends.py)
            finite = ref_lse[torch.isfinite(ref_lse)]
            scale = float(finite.abs().max()) if finite.numel() else 0.0
            lse_tol = 2 * torch.finfo(DTYPES[spec.dtype]).eps * (1.0 + scale)
        else:
            lse_tol = lse_tolerance(plain, ref_lse, softmax_scale=spec.softmax_scale)
        err = lse_err(lse, ref_lse)
        assert err <= lse_tol, f"{spec.id}: max |lse - ref| = {err:.3g} > tolerance {lse_tol:.3g}"
        assert torch.isneginf(lse[empty.to(lse.device)]).all()
    if call.out_base is not None:
        assert torch.isnan(call.out_base[~call.out_mask]).all(), f"{spec.id}: wrote outside out"

