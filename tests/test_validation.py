"""Every bad input gets a TypeError / ValueError naming the argument, expected and actual value, before launch."""

import numpy as np
import pytest
import torch
from helpers import case

import flashdecode
import flashdecode.api as api
from flashdecode import BACKENDS, decode_attention


@pytest.fixture
def good(device):
    return case([5, 20], 8, 2, 64, 16, torch.float16, device)


@pytest.fixture
def no_launch(monkeypatch):
    """Fail the test if any backend runs: validation must come first."""
    for name in list(api._BACKEND_FNS):
        monkeypatch.setitem(api._BACKEND_FNS, name, lambda *a, _n=name: pytest.fail(f"backend {_n} launched"))


def _call(c, **over):
    args = dict(q=c.q, k_cache=c.k_cache, v_cache=c.v_cache, cache_seqlens=c.cache_seqlens, block_table=c.block_table)
    kwargs = {k: over.pop(k) for k in list(over) if k not in args}
    args.update(over)
    return decode_attention(*args.values(), **kwargs)


def _wide(t):
    """t with head dim 512 (above the Triton kernels' 256)."""
    return t.new_zeros(*t.shape[:-1], 512)


CASES = [
    ("q rank", lambda c: dict(q=c.q[0]), ValueError, r"q must be \[B, Hq, D\] or \[B, q_len, Hq, D\], got 2 dims"),
    ("q_len", lambda c: dict(q=c.q[:, None].expand(2, 9, 8, 64)), ValueError, "must have q_len 1..8, got q_len 9"),
    ("k rank", lambda c: dict(k_cache=c.k_cache[0]), ValueError, r"k_cache must be \[num_pages, page_size, Hkv, D\] \(kv_layout 'NHD'\), got 3 dims"),
    ("seqlens rank", lambda c: dict(cache_seqlens=c.cache_seqlens[:, None]), ValueError, r"cache_seqlens must be \[B\], got 2 dims"),
    ("table rank", lambda c: dict(block_table=c.block_table[0]), ValueError, r"block_table must be \[B, max_pages\], got 1 dims"),
    ("group", lambda c: dict(q=c.q[:, :7]), ValueError, "q's 7 heads must be a multiple of k_cache's 2 KV heads"),
    # 0 heads passed the multiple test and failed inside the kernels' launch configuration (ZeroDivisionError)
    ("no heads", lambda c: dict(q=c.q[:, :0]), ValueError, r"q must have at least one head, got shape \(2, 0, 64\)"),
    ("head dim", lambda c: dict(q=c.q[..., :32]), ValueError, "k_cache head_dim must equal q's head_dim 32, got 64"),
    ("k dtype", lambda c: dict(k_cache=c.k_cache.float()), TypeError, "k_cache must have q's dtype torch.float16, got torch.float32"),
    ("v dtype", lambda c: dict(v_cache=c.v_cache.bfloat16()), TypeError, "v_cache must have q's dtype torch.float16, got torch.bfloat16"),
    ("q dtype", lambda c: dict(q=c.q.double()), TypeError, "q must be float16, bfloat16 or float32, got torch.float64"),
    ("out dtype", lambda c: dict(out=torch.empty_like(c.q, dtype=torch.float32)), TypeError, "out must have q's dtype torch.float16, got torch.float32"),
    ("out shape", lambda c: dict(out=c.q[:1].clone()), ValueError, r"out must have q's shape \(2, 8, 64\), got \(1, 8, 64\)"),
    ("seqlens int64", lambda c: dict(cache_seqlens=c.cache_seqlens.long()), TypeError, "cache_seqlens must be int32, got torch.int64"),
    ("table int64", lambda c: dict(block_table=c.block_table.long()), TypeError, "block_table must be int32, got torch.int64"),
    ("seqlens float", lambda c: dict(cache_seqlens=c.cache_seqlens.float()), TypeError, "cache_seqlens must be int32, got torch.float32"),
    ("v shape", lambda c: dict(v_cache=c.v_cache[:-1]), ValueError, "v_cache must have k_cache's shape"),
    ("batch seqlens", lambda c: dict(cache_seqlens=c.cache_seqlens[:1]), ValueError, "cache_seqlens must have q's batch size 2 in dim 0, got 1"),
    ("batch table", lambda c: dict(block_table=c.block_table[:1]), ValueError, "block_table must have q's batch size 2 in dim 0, got 1"),
    ("q stride", lambda c: dict(q=c.q.transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "q must have a contiguous last dimension .stride 1., got stride 8"),
    ("k stride", lambda c: dict(k_cache=c.k_cache.transpose(2, 3).contiguous().transpose(2, 3)), ValueError, "k_cache must have a contiguous last dimension"),
    ("backend", lambda c: dict(backend="cuda"), ValueError, r"backend must be one of .*got 'cuda'"),
    ("splits zero", lambda c: dict(num_splits=0), ValueError, "num_splits must be >= 1, got 0"),
    ("splits float", lambda c: dict(num_splits=2.0), TypeError, "num_splits must be None or an int, got float"),
    ("splits single", lambda c: dict(num_splits=4, backend="triton"), ValueError, "num_splits=4 needs backend 'triton_splitk', 'triton_tma' or 'auto'"),
    ("scale", lambda c: dict(softmax_scale="0.1"), TypeError, "softmax_scale must be None or a float, got str"),
    ("scale nan", lambda c: dict(softmax_scale=float("nan")), ValueError, "softmax_scale must be finite, got nan"),
    ("scale inf", lambda c: dict(softmax_scale=float("-inf")), ValueError, "softmax_scale must be finite, got -inf"),
    ("lse type", lambda c: dict(return_lse="yes"), TypeError, "return_lse must be a bool, got str"),
    ("lse numpy", lambda c: dict(return_lse=np.bool_(True)), TypeError, "return_lse must be a bool, got numpy.bool"),
    ("scale huge", lambda c: dict(softmax_scale=10**400), ValueError, "softmax_scale must be finite, got 1000"),
    ("head dim 512 B0", lambda c: dict(q=_wide(c.q)[:0], k_cache=_wide(c.k_cache), v_cache=_wide(c.v_cache), cache_seqlens=c.cache_seqlens[:0], block_table=c.block_table[:0], backend="triton"), ValueError, "backend 'triton' takes head_dim up to 256, got 512"),
    ("head dim 512", lambda c: dict(q=_wide(c.q), k_cache=_wide(c.k_cache), v_cache=_wide(c.v_cache), backend="triton_splitk"), ValueError, "backend 'triton_splitk' takes head_dim up to 256, got 512; backend 'auto', 'torch_sdpa' or 'torch_naive' takes any"),
    ("not a tensor", lambda c: dict(block_table=[[0]]), TypeError, "block_table must be a torch.Tensor, got list"),
    ("layout", lambda c: dict(kv_layout="NDH"), ValueError, r"kv_layout must be one of \('NHD', 'HND'\), got 'NDH'"),
    ("HND heads", lambda c: dict(kv_layout="HND"), ValueError, r"q's 8 heads must be a multiple of k_cache's 16 KV heads \(dim 1 of \(\d+, 16, 2, 64\), kv_layout 'HND'\)"),
    ("dense batch", lambda c: dict(block_table=None), ValueError, "a dense k_cache .block_table=None. must have q's batch size 2 in dim 0"),
    ("dense rank", lambda c: dict(block_table=None, k_cache=c.k_cache[0]), ValueError, r"k_cache must be \[B, max_len, Hkv, D\]"),
    ("deterministic type", lambda c: dict(deterministic=1), TypeError, "deterministic must be a bool, got int"),
    ("deterministic splits", lambda c: dict(deterministic=True, num_splits=2), ValueError, "num_splits must be None, got 2"),
    ("deterministic sdpa", lambda c: dict(deterministic=True, backend="torch_sdpa"), ValueError, r"deterministic=True is not offered by backend 'torch_sdpa' \(its fused kernels may change with the batch\)"),
    ("deterministic tma", lambda c: dict(deterministic=True, backend="triton_tma"), ValueError, "deterministic=True is not offered by backend 'triton_tma' .its splits are cut on the device"),
    ("device", lambda c: dict(cache_seqlens=c.cache_seqlens.to("meta")), ValueError, "cache_seqlens must be on q's device"),
]


@pytest.mark.parametrize("what,change,exc,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_message(good, no_launch, what, change, exc, message):
    with pytest.raises(exc, match=message):
        _call(good, **change(good))


def test_batch_zero_launches_nothing(device, no_launch):
    c = case([], 8, 2, 64, 16, torch.float16, device)
    out = decode_attention(*c.args)
    assert out.shape == (0, 8, 64)


def test_backends_listed():
    assert flashdecode.BACKENDS == BACKENDS
    assert set(BACKENDS) == {"auto", "reference", "torch_naive", "torch_sdpa", "triton", "triton_splitk", "triton_tma"}
    assert set(api._BACKEND_FNS) == set(BACKENDS) - {"auto"}


def test_import_does_no_work():
    """Importing flashdecode compiles nothing and touches no GPU (run in a fresh interpreter)."""
    import subprocess
    import sys

    code = (
        "import sys, torch; import flashdecode; "
        "assert not torch.cuda.is_initialized(), 'CUDA initialised at import'; "
        "print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "ok", result.stderr


def test_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch, no_launch):
    # the kernel modules first, under the interpreter: @triton.jit reads TRITON_INTERPRET when it decorates, so
    # importing them here, interpreter off, would leave this worker's later tests with compiled kernels and no GPU
    api._kernels()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    c = case([5, 20], 8, 2, 64, 16, torch.float16, "cpu")
    for backend in ("triton", "triton_splitk"):
        with pytest.raises(ValueError, match=f"backend '{backend}' needs CUDA tensors .* got device cpu"):
            decode_attention(*c.args, backend=backend)
