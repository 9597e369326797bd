"""GPU-only serving contracts: the custom ops in a CUDA graph captured at short lengths and replayed at long ones,
no host sync on the decode-step path, and the generation loop with its captured step equal to generate()."""

import pytest
import torch
from helpers import case, max_err, output_tolerance, reference_of

import flashdecode.ops  # noqa: F401 (registers torch.ops.flashdecode.*)
from flashdecode import PagedKVCache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (runs natively on the H200)")


def _step(q, k_new, v_new, k_cache, v_cache, lens, table, slots, out, backend):
    torch.ops.flashdecode.append_kv(k_new, v_new, k_cache, v_cache, slots, "auto")
    out.copy_(torch.ops.flashdecode.decode_attention(q, k_cache, v_cache, lens, table, None, backend, None))


def _last_slots(lens, table, page_size):
    last = (lens - 1).long()
    return (table.gather(1, (last // page_size)[:, None])[:, 0] * page_size + last % page_size).int()


@pytest.mark.parametrize("backend", ["auto", "triton", "triton_splitk"])
def test_ops_cuda_graph_replay_with_growing_lengths(backend):
    """Capture append + attend at lengths 5..40 (one chunk each), replay at 300..5000 (many chunks): every replay
    equals eager op calls bit for bit, and the last one matches the float64 reference."""
    c = case([2000, 5000, 700], 16, 2, 128, 16, torch.bfloat16, "cuda", seed=7)
    page_size = c.k_cache.shape[1]
    full = c.cache_seqlens.clone()
    lens = torch.tensor([5, 40, 1], dtype=torch.int32, device="cuda")
    slots = _last_slots(lens, c.block_table, page_size)
    k_new = torch.empty(3, 2, 128, dtype=torch.bfloat16, device="cuda")
    v_new = torch.empty_like(k_new)
    out = torch.empty_like(c.q)
    args = (c.q, k_new, v_new, c.k_cache, c.v_cache, lens, c.block_table, slots, out, backend)
    # the new token's K/V is the value already in the cache at that slot, so the reference stays valid
    def load_new():
        pages, rows = (slots // page_size).long(), (slots % page_size).long()
        k_new.copy_(c.k_cache[pages, rows])
        v_new.copy_(c.v_cache[pages, rows])

    load_new()
    _step(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _step(*args)
    eager = torch.empty_like(out)
    for grown in ([5, 40, 1], [300, 4000, 700], full.tolist()):
        lens.copy_(torch.tensor(grown, dtype=torch.int32))
        slots.copy_(_last_slots(lens, c.block_table, page_size))
        load_new()
        graph.replay()
        _step(*args[:-2], eager, backend)
        assert torch.equal(out, eager), grown
    ref_out, _ = reference_of(c)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)


def test_decode_step_has_no_host_sync():
    """Host page bookkeeping (pages for new tokens, a sequence leaving and one joining), the device step tensors and
    both ops: nothing waits for the GPU (sync debug mode "error" raises on a synchronising call), and afterwards the
    device tables are what the host says."""
    from test_cache import _assert_tables_match_host

    cache = PagedKVCache(2, 8, 128, num_pages=64, page_size=16, max_batch=4, max_seq_len=256, dtype=torch.bfloat16)
    for n in (15, 16, 100):
        cache.add_sequence(n)
    q = torch.randn(4, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(4, 8, 128, dtype=torch.bfloat16, device="cuda")

    def step():
        cache.grow()
        cache.update_step_tensors()
        for layer in range(2):
            torch.ops.flashdecode.append_kv(kv, kv, cache.k_pools[layer], cache.v_pools[layer], cache.slot_mapping)
            torch.ops.flashdecode.decode_attention(q, cache.k_pools[layer], cache.v_pools[layer], cache.seqlens,
                                                   cache.block_table, None, "auto", None)  # fmt: skip

    step()  # compile first: the compiler may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):  # crosses a page edge for the row of 16 and allocates
            step()
        cache.free(0)  # continuous batching: a sequence finishes, another joins with its prompt's pages
        cache.add_sequence(40)
        cache.slots(0, 0, 40)
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert cache.lengths == [41, 21, 105, 0]
    _assert_tables_match_host(cache)


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graph"])
def test_generate_on_gpu_equals_generate(cuda_graph):
    transformers = pytest.importorskip("transformers")
    from test_transformers import TINY, hf_greedy, prompts_of

    from flashdecode.integrations.transformers import generate

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**TINY, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).eval().cuda()
    prompts = prompts_of([5, 17, 1, 33], seed=2)
    res = generate(model, prompts, 20, max_batch=3, page_size=16, cuda_graph=cuda_graph)
    assert res.cuda_graph == cuda_graph, res.notes
    assert res.tokens == [hf_greedy(model, p, 20) for p in prompts]
