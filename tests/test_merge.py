"""merge_states against the float64 reference, with empty sides, and as the inverse of splitting a sequence."""

import pytest
import torch
from helpers import case, lse_err, max_err, reference_of

from flashdecode import decode_attention, merge_states
from flashdecode.reference import reference_merge_states


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_merge_matches_reference(dtype, device):
    gen = torch.Generator().manual_seed(0)
    out_a, out_b = (torch.randn(3, 5, 64, generator=gen).to(device, dtype) for _ in range(2))
    lse_a, lse_b = (torch.randn(3, 5, generator=gen).mul(10).to(device) for _ in range(2))
    out, lse = merge_states(out_a, lse_a, out_b, lse_b)
    ref_out, ref_lse = reference_merge_states(out_a, lse_a, out_b, lse_b)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert max_err(out, ref_out) <= torch.finfo(dtype).eps * 2
    assert lse_err(lse, ref_lse) <= 1e-5


def test_merge_with_empty_sides(device):
    out_a = torch.randn(2, 4, 8, device=device)
    lse_a = torch.randn(2, 4, device=device)
    garbage = torch.full_like(out_a, float("nan"))
    empty = torch.full_like(lse_a, float("-inf"))
    # one side empty: the other comes through unchanged, even if the empty side's output is NaN
    for out, lse in (merge_states(out_a, lse_a, garbage, empty), merge_states(garbage, empty, out_a, lse_a)):
        assert torch.allclose(out, out_a, rtol=1e-6, atol=1e-6) and torch.allclose(lse, lse_a)
    # both empty: zeros and -inf, no NaN
    out, lse = merge_states(garbage, empty, garbage, empty)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_merge_of_two_halves_equals_whole(device):
    """Attention over pages [0, n) merged with pages [n, N) equals attention over all pages."""
    page = 8
    c = case([40, 64, 24], 8, 2, 64, page, torch.float32, device, seed=21)
    lens = c.cache_seqlens
    first = torch.minimum(lens, torch.tensor(16, device=device, dtype=torch.int32))
    o1, l1 = decode_attention(c.q, c.k_cache, c.v_cache, first, c.block_table, return_lse=True, backend="triton")
    # the second half: the rest of each sequence, its table shifted by two pages
    o2, l2 = decode_attention(
        c.q, c.k_cache, c.v_cache, lens - first, c.block_table[:, 2:].contiguous(), return_lse=True, backend="triton"
    )
    out, lse = merge_states(o1, l1, o2, l2)
    ref_out, ref_lse = reference_of(c)
    assert max_err(out, ref_out) <= 1e-5 and lse_err(lse, ref_lse) <= 1e-5


def test_merge_validation():
    o, lse = torch.zeros(2, 3, 4), torch.zeros(2, 3)
    with pytest.raises(TypeError, match="lse_a must be float32, got torch.float64"):
        merge_states(o, lse.double(), o, lse)
    with pytest.raises(ValueError, match=r"lse_b must have shape \(2, 3\)"):
        merge_states(o, lse, o, lse[:, :2])
    scalar = torch.zeros(())
    with pytest.raises(ValueError, match="out_a must have at least one dim .* got a 0-d tensor"):
        merge_states(scalar, scalar, scalar, scalar)
    with pytest.raises(ValueError, match="out_a and out_b must match"):
        merge_states(o, lse, o.half(), lse)
    with pytest.raises(TypeError, match="out_a must be a torch.Tensor"):
        merge_states([1.0], lse, o, lse)


def test_merge_of_parts_equals_the_whole_call_only_where_positions_do_not_matter():
    """docs/features.md, "Features and merge_states": each call places its query at its own last position, so a
    prefix part and a suffix part merge into the whole call for plain q_len = 1 attention and sinks given to one
    part, and not with a window, ALiBi, sinks on both parts or q_len > 1. float64 reference, so a match is exact to
    rounding and a mismatch is O(1)."""
    page, cut = 8, 16
    c = case([40, 64, 24], 4, 2, 32, page, torch.float32, "cpu", seed=3)
    lens, table = c.cache_seqlens, c.block_table
    head_lens, tail_lens = lens.clamp(max=cut), (lens - cut).clamp(min=0)
    tail_table = table[:, cut // page :].contiguous()
    sinks, slopes = torch.tensor([0.5, -1.0, 2.0, 0.3]), torch.tensor([0.25, 0.5, 0.125, 1.0])

    def merged_vs_whole(q, head_kw, tail_kw, whole_kw):
        call = lambda lens_, table_, kw: decode_attention(  # noqa: E731
            q, c.k_cache, c.v_cache, lens_, table_, return_lse=True, backend="reference", **kw)
        out, _ = merge_states(*call(head_lens, table, head_kw), *call(tail_lens, tail_table, tail_kw))
        return max_err(out, call(lens, table, whole_kw)[0])

    assert merged_vs_whole(c.q, {}, {}, {}) < 1e-6
    assert merged_vs_whole(c.q, dict(sinks=sinks), {}, dict(sinks=sinks)) < 1e-6
    assert merged_vs_whole(c.q, dict(sinks=sinks), dict(sinks=sinks), dict(sinks=sinks)) > 1e-3
    alibi = dict(alibi_slopes=slopes)
    assert merged_vs_whole(c.q, alibi, alibi, alibi) > 1e-3
    window = dict(window_left=5)
    assert merged_vs_whole(c.q, window, window, window) > 1e-3
    two = torch.randn(3, 2, 4, 32, generator=torch.Generator().manual_seed(4))  # q_len 2: causal among them
    assert merged_vs_whole(two, {}, {}, {}) > 1e-3
