"""Bad feature arguments get a TypeError / ValueError naming the argument and value, before any launch."""

import pytest
import torch
from helpers import case

import flashdecode.api as api
from flashdecode import decode_attention


@pytest.fixture
def good(device):
    return case([5, 20], 8, 2, 64, 16, torch.bfloat16, device)


@pytest.fixture
def no_launch(monkeypatch):
    for name in list(api._BACKEND_FNS):
        monkeypatch.setitem(api._BACKEND_FNS, name, lambda *a, _n=name: pytest.fail(f"backend {_n} launched"))


def _fp8(c):
    return dict(k_cache=c.k_cache.to(torch.float8_e4m3fn), v_cache=c.v_cache.to(torch.float8_e4m3fn))


CASES = [
    ("softcap type", lambda c: dict(softcap="1"), TypeError, "softcap must be None or a float, got str"),
    ("softcap negative", lambda c: dict(softcap=-1.0), ValueError, r"softcap must be > 0 \(or 0 / None for off\), got -1.0"),
    ("softcap nan", lambda c: dict(softcap=float("nan")), ValueError, "softcap must be > 0 .*got nan"),
    ("window type", lambda c: dict(window_left=3.0), TypeError, "window_left must be None or an int, got float"),
    ("window negative", lambda c: dict(window_left=-2), ValueError, r"window_left must be >= 0 \(or -1 / None for off\), got -2"),
    ("alibi type", lambda c: dict(alibi_slopes=[0.1] * 8), TypeError, "alibi_slopes must be None or a torch.Tensor, got list"),
    ("alibi dtype", lambda c: dict(alibi_slopes=torch.ones(8, dtype=torch.float64)), TypeError, "alibi_slopes must be float32, got torch.float64"),
    ("alibi shape", lambda c: dict(alibi_slopes=torch.ones(2)), ValueError, r"alibi_slopes must be contiguous \[Hq\] = \[8\], got shape \(2,\)"),
    ("sinks shape", lambda c: dict(sinks=torch.ones(8, 1)), ValueError, r"sinks must be contiguous \[Hq\] = \[8\], got shape \(8, 1\)"),
    ("sinks device", lambda c: dict(sinks=torch.ones(8, device="meta")), ValueError, "sinks must be on q's device"),
    ("scale without fp8", lambda c: dict(k_scale=0.5), ValueError, "k_scale applies to an fp8 cache .*got k_cache torch.bfloat16"),
    ("scale type", lambda c: dict(**_fp8(c), v_scale="2"), TypeError, "v_scale must be None, a float or a float32 tensor, got str"),
    ("scale tensor", lambda c: dict(**_fp8(c), k_scale=torch.ones(2)), ValueError, r"k_scale must be a 0-d / 1-element float32 tensor, got torch.float32 shape \(2,\)"),
    ("scale dtype", lambda c: dict(**_fp8(c), k_scale=torch.tensor(1.0, dtype=torch.float64)), ValueError, "k_scale must be a 0-d / 1-element float32 tensor, got torch.float64"),
    ("fp8 q fp32", lambda c: dict(**_fp8(c), q=c.q.float()), TypeError, "q must be float16 or bfloat16 with an fp8 cache .torch.float8_e4m3fn., got torch.float32"),
    ("fp8 mixed", lambda c: dict(k_cache=c.k_cache.to(torch.float8_e4m3fn), v_cache=c.v_cache.to(torch.float8_e5m2)), TypeError, "v_cache must have k_cache's fp8 dtype torch.float8_e4m3fn, got torch.float8_e5m2"),
    ("fp8 v only", lambda c: dict(v_cache=c.v_cache.to(torch.float8_e5m2)), TypeError, "v_cache must have q's dtype torch.bfloat16, got torch.float8_e5m2"),
    ("sdpa softcap", lambda c: dict(softcap=1.0, backend="torch_sdpa"), ValueError, "backend 'torch_sdpa' does not support softcap; use one of"),
    ("sdpa q_len", lambda c: dict(q=c.q[:, None].expand(2, 3, 8, 64), backend="torch_sdpa"), ValueError, "backend 'torch_sdpa' does not support q_len > 1"),
    ("sdpa fp8", lambda c: dict(**_fp8(c), backend="torch_sdpa"), ValueError, "backend 'torch_sdpa' does not support an fp8 cache"),
    ("tma softcap", lambda c: dict(softcap=1.0, backend="triton_tma"), ValueError, "backend 'triton_tma' does not support softcap"),
    ("tma fp8", lambda c: dict(**_fp8(c), backend="triton_tma"), ValueError, "backend 'triton_tma' does not support an fp8 cache"),
]


def _call(c, **over):
    args = dict(q=c.q, k_cache=c.k_cache, v_cache=c.v_cache, cache_seqlens=c.cache_seqlens, block_table=c.block_table)
    kwargs = {k: over.pop(k) for k in list(over) if k not in args}
    args.update(over)
    return decode_attention(*args.values(), **kwargs)


@pytest.mark.parametrize("what,change,exc,message", CASES, ids=[c[0] for c in CASES])
def test_bad_feature_message(good, no_launch, what, change, exc, message):
    with pytest.raises(exc, match=message):
        _call(good, **change(good))


def test_off_values_are_off(good, device):
    """softcap 0 and window_left -1 mean off: the same bits as not passing them."""
    base = decode_attention(*good.args, backend="triton")
    assert torch.equal(decode_attention(*good.args, backend="triton", softcap=0.0, window_left=-1), base)


def test_auto_on_cpu_with_features_uses_a_backend_that_has_them(monkeypatch):
    from flashdecode import triton_common

    good = case([5, 20], 8, 2, 64, 16, torch.bfloat16, "cpu")
    monkeypatch.setattr(triton_common, "interpreting", lambda: False)
    f = api._validate_features(good.q, good.k_cache, "auto", 2.0, None, None, None, None, None)
    assert api._choose_backend("auto", None, good.q, good.k_cache, good.block_table, f)[0] == "torch_naive"
    f = api._validate_features(good.q, good.k_cache, "auto", None, None, None, None, None, None)
    assert api._choose_backend("auto", None, good.q, good.k_cache, good.block_table, f)[0] == "torch_sdpa"
