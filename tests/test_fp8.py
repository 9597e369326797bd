"""fp8 KV cache (float8_e4m3fn / float8_e5m2) with per-tensor k_scale != v_scale, q in bf16 / fp16: dequantised in
the kernel, compared with the float64 reference on the dequantised cache. Under the Triton interpreter the fp8
tiles are converted to fp32 (the interpreter's dot path); the native GPU run (scripts/gpu_feat.sh) checks the
fp8 -> bf16 / fp16 conversion feeding tl.dot."""

import pytest
import torch
from feature_helpers import RUN_IDS, RUNS, check
from helpers import case

from flashdecode import decode_attention

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def fp8_case(lens, fp8, q_dtype, device, seed, k_scale=0.05, v_scale=0.3, hq=8, hkv=2, d=64, page=16):
    """A paged case whose cache is quantised: k_fp8 = k / k_scale, so the dequantised cache is ~N(0, 1) again.
    Unused pages stay NaN (NaN is representable in both fp8 formats)."""
    c = case(lens, hq, hkv, d, page, torch.float32, device, seed=seed)
    k8 = (c.k_cache / k_scale).to(FP8[fp8])
    v8 = (c.v_cache / v_scale).to(FP8[fp8])
    return (c.q.to(q_dtype), k8, v8, c.cache_seqlens, c.block_table)


@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("fp8,q_dtype", [("e4m3", torch.bfloat16), ("e5m2", torch.float16)], ids=["e4m3-bf16", "e5m2-fp16"])
def test_fp8_cache_float_scales(fp8, q_dtype, backend, num_splits, device):
    args = fp8_case([0, 1, 16, 70], fp8, q_dtype, device, seed=50)
    assert torch.isnan(args[1].float()).any(), "spare pages must be poisoned"
    check(args, backend, num_splits, k_scale=0.05, v_scale=0.3)


@pytest.mark.parametrize("backend,num_splits", RUNS[:2], ids=RUN_IDS[:2])
def test_fp8_cache_device_tensor_scales(backend, num_splits, device):
    """Scales as 0-d / 1-element device tensors (read in the kernel, so a CUDA graph replays with new values)."""
    args = fp8_case([3, 40], "e4m3", torch.bfloat16, device, seed=51)
    k_scale = torch.tensor(0.05, device=device)
    v_scale = torch.tensor([0.3], device=device)
    out, _ = check(args, backend, num_splits, k_scale=k_scale, v_scale=v_scale)
    # new values in the same tensors change the answer like the float scales do
    k_scale.fill_(0.1)
    v_scale.fill_(0.6)
    again = decode_attention(*args, backend=backend, num_splits=num_splits, k_scale=k_scale, v_scale=v_scale)
    floats = decode_attention(*args, backend=backend, num_splits=num_splits, k_scale=0.1, v_scale=0.6)
    assert torch.equal(again, floats) and not torch.equal(again, out)


def test_fp8_with_features_and_multi_token(device):
    args = fp8_case([2, 50], "e4m3", torch.bfloat16, device, seed=52, hq=6, hkv=2)
    q4 = torch.randn(2, 3, 6, 64, generator=torch.Generator(device=device).manual_seed(5), device=device)
    sinks = torch.randn(6, generator=torch.Generator().manual_seed(6)).to(device)
    args = (q4.to(torch.bfloat16),) + args[1:]
    check(args, "triton_splitk", 2, k_scale=0.05, v_scale=0.3, softcap=6.0, window_left=20, sinks=sinks)


def test_one_scale_as_tensor_the_other_default(device):
    args = fp8_case([3, 40], "e5m2", torch.bfloat16, device, seed=53, k_scale=1.0, v_scale=0.3)
    check(args, "triton", None, v_scale=torch.tensor(0.3, device=device))


@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
def test_16_bit_tiles_into_the_dot_as_on_the_gpu(backend, num_splits, device, monkeypatch):
    """The GPU's path for fp16 (and fp8 under an fp16 q): tiles go into ``tl.dot`` unconverted (DOT_F32 False).
    Under the interpreter ``dot_in_fp32`` upcasts every dtype (its bf16 dot is wrong), so no other CPU test runs
    that branch: a mutation dropping its accumulator's rescale passed test_backends, test_fp8 and test_contracts,
    and fails here on every path (the planned chunks span several tiles on 2 SMs). fp16 dots are right
    in the interpreter, so here the GPU's rule is forced, over sequences of several tiles (and chunks of several
    tiles with 3 splits), for an fp16 cache and an e5m2 one (its fp16 clamp)."""
    from flashdecode import launcher, triton_single, triton_splitk

    gpu_rule = lambda dtype: dtype == torch.float32  # noqa: E731
    monkeypatch.setattr(triton_single, "dot_in_fp32", gpu_rule)
    monkeypatch.setattr(triton_splitk, "dot_in_fp32", gpu_rule)
    monkeypatch.setattr(launcher, "ENABLED", False)  # a recorded launch would replay the other branch
    from flashdecode import api

    monkeypatch.setattr(api, "_num_sms", lambda device: 2)  # few SMs: the planned chunks span several tiles
    lens = [0, 1, 17, 3 * 64 + 5, 400]
    c = case(lens, 16, 2, 64, 16, torch.float16, device, seed=61)
    check(c.args, backend, num_splits)
    check(fp8_case(lens, "e5m2", torch.float16, device, seed=62, hq=16), backend, num_splits, k_scale=0.05,
          v_scale=0.3)  # fmt: skip
