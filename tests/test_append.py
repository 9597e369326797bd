"""append_kv against a plain Python loop (reference_append_kv): page boundaries, -1 slots, untouched pool."""

import pytest
import torch

from flashdecode import append_kv
from flashdecode.reference import reference_append_kv

NAN = float("nan")


def _pool(num_pages, page_size, hkv, d, dtype, device):
    """NaN-poisoned pools: any row the kernel should not touch stays NaN, compared with equal_nan."""
    return (torch.full((num_pages, page_size, hkv, d), NAN, dtype=dtype, device=device) for _ in range(2))


def _assert_same(got, want):
    assert torch.equal(got.cpu().isnan(), want.isnan()), "NaN pattern differs: a wrong row was written or skipped"
    assert torch.equal(got.cpu().nan_to_num(), want.nan_to_num())


@pytest.mark.parametrize(
    "page_size, hkv, d, dtype, slots",
    [
        # last row of page 0, first of page 1, last of page 3 (pool end), a skipped token, first row of page 2
        pytest.param(4, 2, 16, torch.float32, [3, 4, 15, -1, 8], id="P4-Hkv2-D16-f32-boundaries"),
        pytest.param(16, 3, 24, torch.bfloat16, [17, 16, 31, 0, -1, -1, 63], id="P16-Hkv3-D24-bf16"),
        pytest.param(1, 1, 8, torch.float16, [2, 0, 3], id="P1-Hkv1-D8-f16-page-per-token"),
        pytest.param(8, 5, 40, torch.float32, [-1, -1], id="P8-Hkv5-D40-all-skipped"),
        # any negative slot skips (-4: an unallocated table entry's -1 page times page_size): nothing wraps around
        pytest.param(4, 1, 8, torch.float32, [-4, 5, -17], id="P4-negative-slots-skipped"),
    ],
)
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_append_matches_loop(page_size, hkv, d, dtype, slots, backend, device):
    gen = torch.Generator().manual_seed(len(slots))
    k = torch.randn(len(slots), hkv, d, generator=gen).to(dtype).to(device)
    v = torch.randn(len(slots), hkv, d, generator=gen).to(dtype).to(device)
    k_cache, v_cache = _pool(4, page_size, hkv, d, dtype, device)
    slot_mapping = torch.tensor(slots, dtype=torch.int32, device=device)
    want_k, want_v = reference_append_kv(k, v, k_cache, v_cache, slot_mapping)
    append_kv(k, v, k_cache, v_cache, slot_mapping, backend=backend)
    _assert_same(k_cache, want_k)
    _assert_same(v_cache, want_v)


def test_append_strided_inputs_int64_slots(device):
    """k, v as a decode step produces them: [B, Hkv, 1, D] projections indexed at [:, :, 0]; strided pools."""
    batch, hkv, d, page_size = 3, 2, 32, 4
    proj = torch.randn(batch, 1, hkv, d, device=device).transpose(1, 2)  # [B, Hkv, 1, D], non-contiguous
    k, v = proj[:, :, 0], 2 * proj[:, :, 0]
    # pools that are a slice of a wider buffer: page stride larger than page_size * Hkv * D
    wide = torch.full((2, 6, page_size, hkv, d), NAN, device=device)
    k_cache, v_cache = wide[0, 1:5], wide[1, 1:5]
    slots = torch.tensor([7, -1, 12], dtype=torch.int64, device=device)
    want_k, want_v = reference_append_kv(k, v, k_cache, v_cache, slots)
    append_kv(k, v, k_cache, v_cache, slots, backend="triton")
    _assert_same(k_cache, want_k)
    _assert_same(v_cache, want_v)
    # the pages of the wider buffer outside the pool views are untouched
    assert wide[:, 0].isnan().all() and wide[:, 5].isnan().all()


def test_triton_skips_slots_outside_the_pool(device):
    k_cache, v_cache = _pool(2, 4, 1, 16, torch.float32, device)
    k = torch.ones(2, 1, 16, device=device)
    append_kv(k, k, k_cache, v_cache, torch.tensor([8, 1], dtype=torch.int32, device=device), backend="triton")
    written = ~k_cache.isnan().all(-1).all(-1)  # [pages, rows]
    assert written.nonzero().tolist() == [[0, 1]]


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(k_cache_dtype=torch.float8_e4m3fn), TypeError, "k_cache has dtype torch.float8_e4m3fn: fp8 KV caches are not supported"),
        (dict(k_dtype=torch.float16), TypeError, "k must have the cache's dtype torch.float32, got torch.float16"),
        (dict(slot_dtype=torch.float32), TypeError, "slot_mapping must be int32 or int64, got torch.float32"),
        (dict(k_shape=(3, 2, 8)), ValueError, r"k must be \[N, Hkv, D\] = \[N, 1, 8\], got \(3, 2, 8\)"),
        (dict(num_slots=2), ValueError, r"slot_mapping must be \[N\] with N = 3"),
        (dict(backend="cuda"), ValueError, "backend must be one of"),
        (dict(backend=["triton"]), ValueError, "backend must be one of"),
    ],
    ids=["fp8-cache", "k-dtype", "slot-dtype", "k-shape", "slot-count", "backend", "backend-list"],
)
def test_append_errors_name_the_argument(change, error, match):
    k_cache = torch.zeros(2, 4, 1, 8, dtype=change.get("k_cache_dtype", torch.float32))
    v_cache = torch.zeros(2, 4, 1, 8, dtype=change.get("k_cache_dtype", torch.float32))
    k = torch.zeros(change.get("k_shape", (3, 1, 8)), dtype=change.get("k_dtype", torch.float32))
    v = torch.zeros(3, 1, 8)
    slots = torch.zeros(change.get("num_slots", 3), dtype=change.get("slot_dtype", torch.int32))
    with pytest.raises(error, match=match):
        append_kv(k, v, k_cache, v_cache, slots, backend=change.get("backend", "torch"))
