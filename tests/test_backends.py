"""Every backend against the float64 reference on production-like paged inputs."""

import pytest
import torch
from helpers import (
    ALL_BACKENDS,
    KERNEL_BACKENDS,
    case,
    lse_err,
    lse_tolerance,
    max_err,
    output_tolerance,
    ragged_lengths,
    reference_of,
)

from flashdecode import decode_attention

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# (page_size, group, head_dim): every page size (1, 16, and 12 which is not a power of two), every GQA group
# (1, 2, 4, 7, 8) and both head dims appear, crossed with every dtype below
GEOMETRIES = [(16, 1, 64), (1, 2, 128), (12, 4, 64), (16, 7, 128), (12, 8, 128), (1, 7, 64)]


def _cases():
    for dname in DTYPES:
        for page, group, d in GEOMETRIES:
            yield pytest.param(dname, page, group, d, id=f"{dname}-P{page}-G{group}-D{d}")


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("dname,page,group,d", list(_cases()))
def test_backend_matches_reference(backend, dname, page, group, d, device):
    dtype = DTYPES[dname]
    hkv = 2
    c = case(ragged_lengths(page), group * hkv, hkv, d, page, dtype, device, seed=hash((page, group, d)) % 1000)
    ref_out, ref_lse = reference_of(c)
    # a NaN-filled output buffer: every element must be written
    out = torch.full_like(c.q, float("nan"))
    result, lse = decode_attention(*c.args, backend=backend, out=out, return_lse=True)
    assert result.data_ptr() == out.data_ptr()
    assert result.dtype == dtype and result.shape == c.q.shape
    err, tol = max_err(out, ref_out), output_tolerance(c, ref_out, dtype)
    if backend == "torch_sdpa":
        # a baseline, not a kernel of ours: on a GPU, SDPA picks its own fused algorithm and summation order
        tol *= 2
    assert err <= tol, f"{backend}: max |out - ref| = {err:.3g} > tolerance {tol:.3g}"
    if backend == "torch_naive":
        # its scores are rounded to the input dtype before the logsumexp: good to a dtype ulp at the LSE's scale
        tol = 2 * torch.finfo(dtype).eps * (1.0 + float(ref_lse[torch.isfinite(ref_lse)].abs().max()))
    else:
        tol = lse_tolerance(c, ref_lse)
    err = lse_err(lse, ref_lse)
    assert err <= tol, f"{backend}: max |lse - ref| = {err:.3g} > tolerance {tol:.3g}"
    # empty sequence: exact zeros and -inf
    assert torch.equal(out[0].cpu(), torch.zeros_like(out[0].cpu()))
    assert torch.isneginf(lse[0]).all()


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_four_dim_query_and_default_scale(backend, device):
    c = case([5, 40, 33], 8, 2, 64, 16, torch.float16, device, seed=3)
    ref_out, _ = reference_of(c, softmax_scale=0.3)
    q4 = c.q[:, None]
    out = decode_attention(q4, *c.args[1:], backend=backend, softmax_scale=0.3)
    assert out.shape == q4.shape
    assert max_err(out[:, 0], ref_out) <= output_tolerance(c, ref_out, torch.float16, softmax_scale=0.3)
    # default scale is 1/sqrt(D)
    default = decode_attention(*c.args, backend=backend)
    explicit = decode_attention(*c.args, backend=backend, softmax_scale=64**-0.5)
    assert torch.equal(default, explicit)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_strided_inputs_are_honoured(backend, device):
    """q sliced from a packed buffer, a K/V cache that is a view of one KV buffer, a transposed block table."""
    c = case([7, 30, 64], 8, 2, 64, 8, torch.bfloat16, device, seed=4)
    packed = torch.randn(3, 20, 64, device=device).to(torch.bfloat16)
    packed[:, 4:12] = c.q
    q = packed[:, 4:12]
    kv = torch.stack([c.k_cache, c.v_cache], dim=2)  # [pages, page, 2, Hkv, D]
    table_t = c.block_table.t().contiguous().t()
    out = decode_attention(q, kv[:, :, 0], kv[:, :, 1], c.cache_seqlens, table_t, backend=backend)
    expected = decode_attention(*c.args, backend=backend)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_page_permutation_invariance(backend, device):
    """Moving pages around the pool (and the table with them) changes no bit of the output."""
    c = case([3, 50, 17, 64], 16, 4, 64, 4, torch.bfloat16, device, seed=5)
    out = decode_attention(*c.args, backend=backend)
    perm = torch.randperm(c.k_cache.shape[0], generator=torch.Generator().manual_seed(1)).to(device)
    inverse = torch.argsort(perm)
    # page p moves to slot inverse[p]; valid entries follow it, garbage entries stay garbage
    table = c.block_table.clone()
    lens = c.cache_seqlens.cpu().tolist()
    for b, n in enumerate(lens):
        used = -(-n // 4)
        table[b, :used] = inverse[c.block_table[b, :used].long()].to(torch.int32)
    moved = decode_attention(c.q, c.k_cache[perm], c.v_cache[perm], c.cache_seqlens, table, backend=backend)
    assert torch.equal(out, moved)


def test_reference_backend_matches_streaming(device):
    from flashdecode.reference import reference_streaming

    c = case(ragged_lengths(12), 14, 2, 64, 12, torch.float32, device, seed=6)
    out, lse = decode_attention(*c.args, backend="reference", return_lse=True)
    ref_out, ref_lse = reference_streaming(*c.args)
    assert max_err(out, ref_out) <= 1e-6 and lse_err(lse, ref_lse) <= 1e-6


def test_all_sequences_empty(device):
    c = case([0, 0, 0], 8, 2, 64, 16, torch.bfloat16, device)
    for backend in ALL_BACKENDS:
        out, lse = decode_attention(*c.args, backend=backend, return_lse=True, out=torch.full_like(c.q, float("nan")))
        assert torch.equal(out.cpu(), torch.zeros_like(out.cpu())), backend
        assert torch.isneginf(lse).all(), backend


def test_batch_zero_returns_empty(device):
    c = case([], 8, 2, 64, 16, torch.float16, device)
    out, lse = decode_attention(*c.args, return_lse=True, backend="triton_splitk")
    assert out.shape == (0, 8, 64) and lse.shape == (0, 8)


@pytest.mark.parametrize("use_dot", [True, False], ids=["tl.dot", "cuda-cores"])
@pytest.mark.parametrize("group", [1, 2, 8])
def test_both_product_paths(use_dot, group, device):
    """The tl.dot path and the broadcast-and-reduce path agree with the reference (launch_config picks one)."""
    from flashdecode.triton_single import decode_single
    from flashdecode.triton_splitk import decode_splitk

    c = case([1, 40, 100], 2 * group, 2, 64, 16, torch.bfloat16, device, seed=8)
    ref_out, _ = reference_of(c)
    block_h = max(16, group) if use_dot else group
    cfg = dict(USE_DOT=use_dot, BLOCK_H=1 << (block_h - 1).bit_length(), BLOCK_N=32)
    for run in (decode_single, lambda *a, **k: decode_splitk(*a, num_splits=3, **k)):
        out = torch.full_like(c.q, float("nan"))
        run(*c.args, 64**-0.5, out, None, config=cfg)
        assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)


def test_32_and_64_bit_cache_offsets(device, monkeypatch):
    """attend_range's two address paths (OFFS_I32: 32-bit page * stride + row * stride when the host finds that
    every offset fits, else 64-bit) give bit-identical outputs, single pass and split-K, on a ragged batch whose
    table is shuffled and whose page size is not a power of two (unsigned // and % by 12)."""
    from flashdecode import triton_single, triton_splitk

    c = case([0, 1, 13, 100, 161], 8, 2, 64, 12, torch.bfloat16, device, seed=14)
    ref_out, _ = reference_of(c)
    outs = []
    for fits in (True, False):
        for module in (triton_single, triton_splitk):
            monkeypatch.setattr(module, "cache_offsets_fit_int32", lambda *caches, fits=fits: fits)
        for run in (triton_single.decode_single, lambda *a, **k: triton_splitk.decode_splitk(*a, num_sms=8, **k)):
            out = torch.full_like(c.q, float("nan"))
            run(*c.args, 64**-0.5, out, None)
            assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)
            outs.append(out)
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])


def test_cache_offsets_fit_int32():
    """The 32-bit address path only for caches whose largest page * stride + row * stride + column is < 2**31
    elements (meta tensors: no memory), whatever the layout's strides."""
    from flashdecode.triton_common import cache_offsets_fit_int32

    def cache(num_pages, page_size=16, hkv=8, d=128):
        return torch.empty(num_pages, page_size, hkv, d, device="meta")

    # 2**31 elements are 2**17 pages of 16 x 8 x 128
    assert cache_offsets_fit_int32(cache(2**17 - 1), cache(1000))
    assert not cache_offsets_fit_int32(cache(2**17 + 1)) and not cache_offsets_fit_int32(cache(10), cache(2**17 + 1))
    # HND: [num_pages, Hkv, page, D] viewed as NHD (the kernels' view); the row stride is D, the page stride the same
    hnd = torch.empty(2**17 + 1, 8, 16, 128, device="meta").permute(0, 2, 1, 3)
    assert not cache_offsets_fit_int32(hnd) and cache_offsets_fit_int32(hnd[: 2**17 - 1])


def test_single_pass_long_grid_tile():
    """The GQA single pass takes PREFETCH_TILE up to one wave of PREFETCH_TILE_PER_SM programs per SM and
    PREFETCH_DEEP_TILE (4 per SM) beyond; other tiles are left alone."""
    from flashdecode import triton_common as tc

    gqa = tc.launch_config(128, 4, torch.bfloat16, single=True)
    assert tc.uses_prefetch_tile(gqa)
    wave = tc.PREFETCH_TILE_PER_SM * 132
    assert not tc.single_pass_long_grid(gqa, wave, 132) and tc.single_pass_long_grid(gqa, wave + 1, 132)
    assert not tc.single_pass_long_grid(gqa, wave + 1, None)
    mha = tc.launch_config(128, 1, torch.bfloat16, single=True)
    assert not tc.uses_prefetch_tile(mha) and not tc.single_pass_long_grid(mha, 10**6, 132)


@pytest.mark.parametrize("prefetch", [True, False], ids=["pages-ahead", "pages-in-step"])
def test_both_page_walks(prefetch, device):
    """attend_range's two page walks (page ids one tile ahead, or loaded in the tile's own step) agree with the
    reference: lengths 0, 1, one tile, one tile + 1 and several pages, single pass, fixed splits that start inside a
    sequence, and the planned cut (launch_config picks the walk; both are forced here)."""
    from flashdecode.triton_single import decode_single
    from flashdecode.triton_splitk import decode_splitk

    c = case([0, 1, 32, 33, 100, 161], 8, 2, 64, 16, torch.bfloat16, device, seed=12)
    ref_out, _ = reference_of(c)
    cfg = dict(BLOCK_N=32, num_stages=3, PREFETCH_PAGES=prefetch)
    runs = (decode_single, lambda *a, **k: decode_splitk(*a, num_splits=3, **k),
            lambda *a, **k: decode_splitk(*a, num_sms=8, **k))  # fmt: skip
    for run in runs:
        out = torch.full_like(c.q, float("nan"))
        run(*c.args, 64**-0.5, out, None, config=cfg)
        assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)
