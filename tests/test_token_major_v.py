"""Token-major V pages (``api.v_token_major``): V stored [num_pages, Hkv, D, page_size] and passed as its
[num_pages, page_size, Hkv, D] view (or, with kv_layout="HND", as ``transpose(-1, -2)`` of it).

The Triton kernels read such a V along its tokens: whole runs of min(page_size, BLOCK_N) tokens as vectors, then
the last partial run token by token. Every slot past each sequence's end in its last page holds NaN here, so a run
read whole past the end would turn the output into NaN (0 * NaN); every backend is held to the float64 reference.
"""

import dataclasses

import pytest
import torch
from feature_helpers import RUN_IDS, RUNS, check
from helpers import ALL_BACKENDS, case, max_err, output_tolerance, ragged_lengths, reference_of

from flashdecode import append_kv, decode_attention
from flashdecode.api import v_token_major
from flashdecode.cases import poison_page_tails
from flashdecode.cases import token_major_v as token_major
from flashdecode.reference import reference_append_kv

NAN = float("nan")


def poison_tails(c):
    """NaN in every K and V slot past each sequence's length in its last page (unused pages are NaN already), and
    a page 0 of NaN that no sequence uses: where a page-id load that masked a token out would point."""
    nan_page = torch.full_like(c.k_cache[:1], NAN)
    table = torch.where(c.block_table >= 0, c.block_table + 1, c.block_table)
    c = dataclasses.replace(c, k_cache=torch.cat([nan_page, c.k_cache]), v_cache=torch.cat([nan_page, c.v_cache]),
                            block_table=table)  # fmt: skip
    return poison_page_tails(c)


RUNS_ALL = [(b, None) for b in ALL_BACKENDS] + [("triton_splitk", 3)]


@pytest.mark.parametrize("page_size", [8, 16, 32])
@pytest.mark.parametrize("backend,num_splits", RUNS_ALL, ids=[f"{b}-{s}" for b, s in RUNS_ALL])
def test_token_major_v(backend, num_splits, page_size, device):
    # lengths at every run edge (empty, 1, page - 1, page, page + 1, ...) and one over several tiles
    c = poison_tails(case(ragged_lengths(page_size), 8, 2, 64, page_size, torch.bfloat16, device, seed=21))
    ref_out, _ = reference_of(c)
    v = token_major(c.v_cache)
    assert v_token_major(v) and not v_token_major(c.v_cache)
    out = torch.full_like(c.q, NAN)
    decode_attention(c.q, c.k_cache, v, c.cache_seqlens, c.block_table, backend=backend, num_splits=num_splits,
                     out=out)  # fmt: skip
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)


@pytest.mark.parametrize("backend", ["triton", "triton_splitk"])
def test_token_major_v_hnd(backend, device):
    """kv_layout="HND": V given as [num_pages, Hkv, page_size, D], the transpose of [num_pages, Hkv, D, page_size]."""
    c = poison_tails(case([0, 1, 15, 16, 17, 53], 8, 2, 64, 16, torch.float16, device, seed=23))
    ref_out, _ = reference_of(c)
    k = c.k_cache.transpose(1, 2).contiguous()
    v = token_major(c.v_cache).transpose(1, 2)
    out = decode_attention(c.q, k, v, c.cache_seqlens, c.block_table, backend=backend, kv_layout="HND")
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float16)


@pytest.mark.parametrize("kv", ["e4m3", "bf16"])
@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
def test_token_major_v_with_features(backend, num_splits, q_len, kv, device):
    """An e4m3 cache (the layout's purpose) or a bf16 one, one or two query tokens, a window whose first token lies
    inside a run, softcap: the walk starts at the run and masks the tokens before the window (with one query token
    nothing else masks them), whose pages it still reads. (The interpreter turns an fp8 NaN into a number: the bf16
    case is the one that sees a NaN read on CPU.)"""
    c = poison_tails(case([5, 37, 70], 6, 2, 64, 16, torch.float32, device, seed=22))
    q = torch.randn(3, q_len, 6, 64, generator=torch.Generator(device=device).manual_seed(7), device=device)
    if kv == "e4m3":
        k, v = (c.k_cache / 0.05).to(torch.float8_e4m3fn), (c.v_cache / 0.3).to(torch.float8_e4m3fn)
        kw = dict(k_scale=0.05, v_scale=0.3)
    else:
        k, v, kw = c.k_cache.to(torch.bfloat16), c.v_cache.to(torch.bfloat16), {}
    args = (q.to(torch.bfloat16), k, token_major(v), c.cache_seqlens, c.block_table)
    check(args, backend, num_splits, window_left=20, softcap=6.0, **kw)


@pytest.mark.parametrize("kv", ["bf16", "e4m3"])
@pytest.mark.parametrize("page_size", [3, 12, 48])
@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
def test_token_major_v_pages_of_any_size(backend, num_splits, page_size, kv, device):
    """Page sizes that are not a power of two. A run is the largest power of two that divides the page size, at
    most the tile (``RUN_C``): runs of 1, 4 and 16 tokens here. min(page size, tile), as runs were first cut, gave
    runs of 3, 12 or 48 tokens (no power of two: the 3-D tile does not compile) and, with 32-token tiles,
    48-token pages cut into 32-token runs that cross into the next page (found by tests/test_fuzz.py)."""
    c = poison_tails(case(ragged_lengths(page_size, long=100), 8, 2, 32, page_size, torch.float32, device, seed=25))
    if kv == "e4m3":
        k, v = (c.k_cache / 0.05).to(torch.float8_e4m3fn), (c.v_cache / 0.3).to(torch.float8_e4m3fn)
        kw = dict(k_scale=0.05, v_scale=0.3)
    else:
        k, v, kw = c.k_cache.to(torch.bfloat16), c.v_cache.to(torch.bfloat16), {}
    args = (c.q.to(torch.bfloat16), k, token_major(v), c.cache_seqlens, c.block_table)
    check(args, backend, num_splits, **kw)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_append_kv_writes_token_major_v(backend, device):
    hkv, d, page_size = 2, 32, 16
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(5, hkv, d, generator=gen).to(device)
    v = torch.randn(5, hkv, d, generator=gen).to(device)
    slots = torch.tensor([3, 16, 63, -1, 17], dtype=torch.int32, device=device)
    k_cache = torch.full((4, page_size, hkv, d), NAN, device=device)
    v_cache = token_major(torch.full((4, page_size, hkv, d), NAN, device=device))
    want_k, want_v = reference_append_kv(k, v, k_cache.clone(), v_cache.contiguous(), slots)
    append_kv(k, v, k_cache, v_cache, slots, backend=backend)
    assert torch.equal(v_cache.cpu().nan_to_num(), want_v.cpu().nan_to_num())
    assert torch.equal(v_cache.cpu().isnan(), want_v.cpu().isnan())
    assert torch.equal(k_cache.cpu().nan_to_num(), want_k.cpu().nan_to_num())


def test_token_major_v_errors_name_the_argument(device):
    c = case([5, 20], 8, 2, 64, 16, torch.bfloat16, device, seed=24)
    # token-major, but the head dim 20 elements apart (a slice of wider pages): runs would not be aligned
    wide = torch.zeros(c.v_cache.shape[0], 2, 64, 20, dtype=torch.bfloat16, device=device)
    bad = wide[..., :16].permute(0, 3, 1, 2)
    message = r"token-major v_cache .* head-dim stride 16 .* got strides \(2560, 1, 1280, 20\)"
    with pytest.raises(ValueError, match=message):
        decode_attention(c.q, c.k_cache, bad, c.cache_seqlens, c.block_table, backend="triton")
    strided = torch.zeros(*c.v_cache.shape[:3], 128, dtype=torch.bfloat16, device=device)[..., ::2]
    with pytest.raises(ValueError, match="v_cache must have a contiguous last dimension .* or token-major pages"):
        decode_attention(c.q, c.k_cache, strided, c.cache_seqlens, c.block_table, backend="triton")
    v = token_major(c.v_cache)
    with pytest.raises(ValueError, match="backend 'triton_tma' reads V in TMA boxes .* token-major pages"):
        decode_attention(c.q, c.k_cache, v, c.cache_seqlens, c.block_table, backend="triton_tma")
