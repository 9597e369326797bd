"""Cache layouts: head-major pages (kv_layout="HND") and a dense cache without a block table, for every backend.

Each layout is the same attention as the NHD paged case it is built from: the kernels read it through strides
(no host copy), so the Triton backends must give the NHD result bit for bit, and every backend the reference's.
"""

import pytest
import torch
from helpers import ALL_BACKENDS, KERNEL_BACKENDS, case, max_err, output_tolerance, reference_of

from flashdecode import decode_attention
from flashdecode.reference import gather_sequence

LENGTHS = [0, 1, 15, 16, 17, 53]


def _hnd(cache):
    """The same pages stored head-major: [num_pages, Hkv, page_size, D], contiguous."""
    return cache.transpose(1, 2).contiguous()


def _dense(c, max_len, layout="NHD", pad=0):
    """Each sequence's tokens gathered to [B, max_len, Hkv, D] ("HND": [B, Hkv, max_len, D]), rows past its length
    NaN, as a view into a buffer `pad` rows longer so the batch stride is not max_len * row stride."""
    lens = c.cache_seqlens.cpu().tolist()
    batch, (_, _, hkv, d) = len(lens), c.k_cache.shape
    out = []
    for cache in (c.k_cache, c.v_cache):
        dense = torch.full((batch, max_len + pad, hkv, d), float("nan"), dtype=cache.dtype, device=cache.device)
        for b, n in enumerate(lens):
            dense[b, :n] = gather_sequence(cache, c.block_table[b], n)
        if layout == "HND":
            # [B, Hkv, max_len + pad, D] storage
            out.append(dense.transpose(1, 2).contiguous()[:, :, :max_len])
        else:
            out.append(dense[:, :max_len])
    return out


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hnd_pages(backend, device):
    c = case(LENGTHS, 8, 2, 64, 16, torch.bfloat16, device, seed=11)
    ref_out, _ = reference_of(c)
    out = torch.full_like(c.q, float("nan"))
    decode_attention(c.q, _hnd(c.k_cache), _hnd(c.v_cache), c.cache_seqlens, c.block_table, backend=backend,
                     kv_layout="HND", out=out)  # fmt: skip
    assert max_err(out, ref_out) <= 2 * output_tolerance(c, ref_out, torch.bfloat16)
    if backend in KERNEL_BACKENDS:
        assert torch.equal(out, decode_attention(*c.args, backend=backend))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_dense_cache(backend, layout, device):
    """block_table=None: k_cache[b, t] is token t of sequence b; rows past the length are NaN and never read."""
    c = case(LENGTHS, 12, 4, 32, 16, torch.float16, device, seed=12)
    ref_out, ref_lse = reference_of(c)
    k, v = _dense(c, max_len=60, layout=layout, pad=5)
    if layout == "HND":
        assert k.shape == (len(LENGTHS), 4, 60, 32)
    out, lse = decode_attention(c.q, k, v, c.cache_seqlens, None, backend=backend, kv_layout=layout, return_lse=True)
    assert not out.isnan().any()
    assert max_err(out, ref_out) <= 2 * output_tolerance(c, ref_out, torch.float16)
    assert torch.isneginf(lse[0]).all()


@pytest.mark.parametrize("backend", ["triton", "triton_splitk"])
def test_dense_cache_matches_paged_bitwise_when_pages_are_whole(backend, device):
    """A dense cache is one page per sequence; with the same tiles the kernels' arithmetic is the paged one's."""
    c = case([40, 64, 3], 8, 2, 64, 64, torch.bfloat16, device, seed=13, spare_pages=0, extra_table_columns=0)
    k = torch.stack([gather_sequence(c.k_cache, c.block_table[b], 64) for b in range(3)])
    v = torch.stack([gather_sequence(c.v_cache, c.block_table[b], 64) for b in range(3)])
    dense = decode_attention(c.q, k, v, c.cache_seqlens, None, backend=backend)
    assert torch.equal(dense, decode_attention(*c.args, backend=backend))


# (shape, storage order of its dims): q / out of any strides, [B, Hq, D] and [B, q_len, Hq, D]
ROW_LAYOUTS = [((3, 8, 64), (0, 1, 2)), ((3, 8, 64), (1, 0, 2)), ((3, 2, 8, 64), (0, 1, 2, 3)),
               ((3, 1, 8, 64), (2, 1, 0, 3)), ((1, 1, 64), (0, 1, 2))]  # fmt: skip


@pytest.mark.parametrize("shape, order", ROW_LAYOUTS)
def test_row_strides_are_the_views(shape, order):
    """The single-pass launcher's strides of q / out as [B, q_len, Hq, D] are those of the view it no longer
    builds (so the kernel is specialised as before)."""
    from flashdecode.triton_single import as_rows, row_strides

    t = torch.empty([shape[d] for d in order]).permute(*[order.index(i) for i in range(len(order))])
    assert t.shape == shape
    assert row_strides(t) == as_rows(t).stride()[:3]
