"""torch.library custom ops: same results as the Python API, and a caller compiles with fullgraph=True."""

import pytest
import torch
from helpers import case, max_err, output_tolerance, reference_of

import flashdecode.ops  # noqa: F401 (registers torch.ops.flashdecode.*)
from flashdecode.reference import reference_append_kv


def _decode_step(q, k, v, k_cache, v_cache, seqlens, table, slots, backend):
    """What a model's attention does in a decode step: append the new token's K/V, then attend."""
    torch.ops.flashdecode.append_kv(k, v, k_cache, v_cache, slots, "auto")
    out = torch.ops.flashdecode.decode_attention(q, k_cache, v_cache, seqlens, table, None, backend, None)
    return out * 2.0


def _step_inputs(device):
    """A ragged paged case (shuffled pages, NaN spare pages, poisoned table tails) plus one new token per sequence,
    written at each sequence's last position (the lengths already count it)."""
    c = case([5, 16, 1], 6, 3, 16, 4, torch.float32, device, seed=3)
    page_size = c.k_cache.shape[1]
    last = (c.cache_seqlens - 1).long()
    slots = (c.block_table.gather(1, (last // page_size)[:, None])[:, 0] * page_size + last % page_size).int()
    gen = torch.Generator().manual_seed(1)
    k, v = (torch.randn(3, 3, 16, generator=gen).to(device) for _ in range(2))
    return c, k, v, slots


@pytest.mark.parametrize("backend", ["torch_sdpa", "triton"])
def test_ops_equal_reference(backend, device):
    c, k, v, slots = _step_inputs(device)
    want_k, want_v = reference_append_kv(k, v, c.k_cache, c.v_cache, slots)
    out = _decode_step(c.q, k, v, c.k_cache, c.v_cache, c.cache_seqlens, c.block_table, slots, backend)
    assert torch.equal(c.k_cache.cpu().nan_to_num(), want_k.nan_to_num())
    assert torch.equal(c.v_cache.cpu().nan_to_num(), want_v.nan_to_num())
    ref_out, _ = reference_of(c)
    assert max_err(out / 2.0, ref_out) <= output_tolerance(c, ref_out, torch.float32)


def test_compile_fullgraph_no_graph_breaks(device):
    """torch.compile(fullgraph=True) raises on any graph break; the compiled step equals the eager one, including
    the in-place cache writes (the op declares them, so functionalisation keeps them)."""
    torch._dynamo.reset()
    compiled = torch.compile(_decode_step, fullgraph=True, backend="aot_eager")
    c, k, v, slots = _step_inputs(device)
    eager_k, eager_v = c.k_cache.clone(), c.v_cache.clone()
    eager = _decode_step(c.q, k, v, eager_k, eager_v, c.cache_seqlens, c.block_table, slots, "torch_sdpa")
    out = compiled(c.q, k, v, c.k_cache, c.v_cache, c.cache_seqlens, c.block_table, slots, "torch_sdpa")
    assert torch.equal(out, eager)
    assert torch.equal(c.k_cache.nan_to_num(), eager_k.nan_to_num())
    assert torch.equal(c.v_cache.nan_to_num(), eager_v.nan_to_num())
    explanation = torch._dynamo.explain(_decode_step)(
        c.q, k, v, c.k_cache, c.v_cache, c.cache_seqlens, c.block_table, slots, "torch_sdpa"
    )
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_fake_implementations_match(device):
    """torch.library.opcheck: schema, fake (meta) implementation and the real one agree."""
    c, k, v, slots = _step_inputs(device)
    tests = ("test_schema", "test_faketensor")
    torch.library.opcheck(
        torch.ops.flashdecode.decode_attention.default,
        (c.q, c.k_cache, c.v_cache, c.cache_seqlens, c.block_table, None, "torch_sdpa", None),
        test_utils=tests,
    )
    torch.library.opcheck(
        torch.ops.flashdecode.append_kv.default, (k, v, c.k_cache, c.v_cache, slots, "torch"), test_utils=tests
    )
