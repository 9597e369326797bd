"""GPU-only contracts: no host synchronisation on the kernel path, CUDA-graph capture with growing lengths."""

import pytest
import torch
from helpers import case, max_err, output_tolerance, reference_of

from flashdecode import decode_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (runs natively on the H200)")


@pytest.mark.parametrize("backend", ["auto", "triton", "triton_splitk", "triton_tma", "torch_sdpa"])
def test_no_host_sync(backend):
    c = case([100, 3000, 17], 32, 8, 128, 16, torch.bfloat16, "cuda")
    decode_attention(*c.args, backend=backend)  # compile first: the compiler may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        decode_attention(*c.args, backend=backend, return_lse=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("backend", ["auto", "triton", "triton_splitk", "triton_tma"])
def test_cuda_graph_replay_with_growing_lengths(backend):
    """Capture at short lengths, replay after the lengths grew (more tiles, more pages): equals eager calls."""
    c = case([2000, 5000, 700], 16, 2, 128, 16, torch.bfloat16, "cuda", seed=7)
    full = c.cache_seqlens.clone()
    lens = torch.tensor([5, 40, 1], dtype=torch.int32, device="cuda")
    out = torch.empty_like(c.q)
    args = (c.q, c.k_cache, c.v_cache, lens, c.block_table)
    decode_attention(*args, backend=backend, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(*args, backend=backend, out=out)
    for grown in ([5, 40, 1], [300, 4000, 700], full.tolist()):
        lens.copy_(torch.tensor(grown, dtype=torch.int32))
        graph.replay()
        eager = decode_attention(*args, backend=backend)
        assert torch.equal(out, eager), grown
    ref_out, _ = reference_of(c)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)


@pytest.mark.parametrize(
    "lens",
    [[2048] * 8, [4096] * 16, [300, 9000], [1024] * 24, [200] * 132],
    # 132 x 200: 4 programs a SM on the H200's 132 SMs, a plan's single pass on gluon_single
    ids=["8x2048", "16x4096", "uneven", "merged-fixed", "gluon-single"],
)
def test_cuda_graph_with_a_plan_replays_any_lengths(lens):
    """A plan made from one batch's lengths, captured in a graph, replayed after the lengths changed (grown to the
    last page, shrunk to one token, ragged): equals eager calls with the same plan and stays within the reference's tolerance; the capture itself
    syncs nothing (the plan's host read happened before)."""
    from flashdecode import plan_decode

    c = case(lens, 28, 4, 128, 16, torch.bfloat16, "cuda", seed=11)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    lens_t = c.cache_seqlens.clone()
    args = (c.q, c.k_cache, c.v_cache, lens_t, c.block_table)
    out = torch.empty_like(c.q)
    decode_attention(*args, plan=plan, out=out)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            decode_attention(*args, plan=plan, out=out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # each sequence within its own pages: all of them, one token, or alternately all and none
    own = [-(-n // 16) * 16 for n in lens]
    for grown in (own, [1] * len(lens), [n if b % 2 == 0 else 0 for b, n in enumerate(own)]):
        lens_t.copy_(torch.tensor(grown, dtype=torch.int32))
        graph.replay()
        assert torch.equal(out, decode_attention(*args, plan=plan)), grown
        ref_out, _ = reference_of(c.__class__(c.q, c.k_cache, c.v_cache, lens_t, c.block_table))
        assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16), grown


def test_fixed_splits_merged_in_the_last_program_under_contention():
    """A plan of few fixed splits over many (sequence, row) pairs merges in the last split program, with counters the
    plan owns and every call leaves at zero: 200 calls in a row all match the first, bit for bit, and the reference."""
    from flashdecode import plan_decode

    c = case([1024] * 24, 28, 4, 128, 16, torch.bfloat16, "cuda", seed=72)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert plan.counters is not None, plan.reason
    ref, _ = reference_of(c)
    first = decode_attention(*c.args, plan=plan)
    assert max_err(first, ref) <= output_tolerance(c, ref, torch.bfloat16)
    for _ in range(200):
        assert torch.equal(decode_attention(*c.args, plan=plan), first)
    assert int(plan.counters.abs().sum()) == 0


def test_fused_merge_is_exact_and_order_free_under_contention():
    """The fused merge (planned mode, B * Hq >= #SMs): each sequence's last chunk program to finish merges. Run on
    a ragged batch with long sequences (many chunk programs racing per counter) after filling the caching
    allocator with garbage of every workspace size (the planner must zero the counters), 200 times: every run
    matches the float64 reference and all runs are bit-identical (the merge sums in chunk order, whatever order the
    programs arrive in)."""
    from flashdecode import triton_splitk

    c = case([16384, 1, 0, 9000, 4096, 33, 12000, 700] * 4, 32, 8, 128, 16, torch.bfloat16, "cuda", seed=71)
    assert triton_splitk.FUSED_COMBINE and c.q.shape[0] * c.q.shape[1] >= torch.cuda.get_device_properties(0).multi_processor_count
    for n in (256, 512, 1024, 4096):
        junk = torch.full((n,), 12345, dtype=torch.int32, device="cuda")
        del junk
    ref, _ = reference_of(c)
    tol = output_tolerance(c, ref, torch.bfloat16)
    first = decode_attention(*c.args, backend="triton_splitk")
    assert max_err(first, ref) <= tol
    for _ in range(200):
        assert torch.equal(decode_attention(*c.args, backend="triton_splitk"), first)



@pytest.fixture(scope="module")
def late_copy():
    """A kernel that lets the next kernel start at once (PDL), spins for ~1 ms, then copies src into dst."""
    import triton
    import triton.language as tl

    @triton.jit
    def _late_copy(SRC, DST, n, iters, BLOCK: tl.constexpr):
        tl.extra.cuda.gdc_launch_dependents()
        x = tl.full([BLOCK], 1.0, tl.float32)
        for _ in range(iters):
            x = x * 0.999 + 0.001
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            v = tl.load(SRC + offs, mask=offs < n).to(tl.float32)
            tl.store(DST + offs, (v * x).to(DST.dtype.element_ty), mask=offs < n)

    return lambda src, dst: _late_copy[(1,)](src, dst, src.numel(), 400000, BLOCK=1024)


CHAINS = {
    # (lengths, Hq, Hkv, decode_attention options; plan=True: made by plan_decode for these lengths)
    "single pass": ([3000] * 8, 32, 8, dict(backend="triton")),
    "fixed splits, combine": ([4096] * 4, 12, 2, dict(backend="triton_splitk", num_splits=16)),
    "plan, merged fixed splits": ([1024] * 24, 28, 4, dict(plan=True)),
    "planner, fused merge": ([16384, 1, 0, 9000] * 8, 32, 8, dict(backend="triton_splitk")),
    "in place, combine": ([300, 9000, 40], 12, 2, dict(backend="triton_splitk")),
    "dual path": ([2048] * 64, 32, 8, dict(backend="auto")),
}


@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_chained_calls_wait_for_the_kernel_before_them(name, graph, late_copy):
    """A call's first kernel is launched with PDL (``triton_common.chain_pdl``), so it may be scheduled while the
    kernel before it still runs, and must wait before its first load. Behind a kernel that lets it start at once and
    writes its q only after ~1 ms, a chain of calls (each one's q the previous one's output, every buffer
    poisoned with NaN first) equals the same launches with a device sync between them, bit for bit, eagerly and
    replayed in a CUDA graph."""
    from flashdecode import plan_decode

    lens, hq, hkv, opts = CHAINS[name]
    c = case(lens, hq, hkv, 128, 16, torch.bfloat16, "cuda", seed=5)
    opts = dict(opts)
    if opts.pop("plan", False):
        opts["plan"] = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    rest = (c.k_cache, c.v_cache, c.cache_seqlens, c.block_table)
    bufs = [torch.empty_like(c.q) for _ in range(4)]

    def chain(sync):
        late_copy(c.q, bufs[0])
        for q, out in zip(bufs, bufs[1:]):
            if sync:
                torch.cuda.synchronize()
            decode_attention(q, *rest, out=out, **opts)

    chain(True)
    expected = [b.clone() for b in bufs]
    assert all(torch.isfinite(e).all() for e in expected)
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            chain(False)
    for _ in range(10):
        for b in bufs:
            b.fill_(float("nan"))
        g.replay() if graph else chain(False)
        torch.cuda.synchronize()
        for b, e in zip(bufs, expected):
            assert torch.equal(b, e), name


@pytest.fixture(scope="module")
def pool_past_int32():
    """K and V pools of (2**17 + 256) pages of 16 x 8 x 128 bf16 (4.3 GB each, NaN where unused), so every element
    of the top 256 pages lies past 2**31: the kernels must take their 64-bit offsets (``cache_offsets_fit_int32``)
    and append must write there. Six sequences on shuffled top pages, one with page 0 among them."""
    page, hkv, d, low = 16, 8, 128, 2**17
    num_pages = low + 256
    gen = torch.Generator(device="cuda").manual_seed(21)
    k_cache = torch.full((num_pages, page, hkv, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    v_cache = torch.full_like(k_cache, float("nan"))
    lens = [1, 17, 300, 2000, 0, 129]
    ids = (low + torch.randperm(256, generator=torch.Generator().manual_seed(5))).tolist()
    table = torch.full((len(lens), 130), -1, dtype=torch.int32)
    for b, n in enumerate(lens):
        pages = [ids.pop() for _ in range(-(-n // page))]
        if b == 5:
            pages[0] = 0  # one page below 2**31
        table[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        for p in pages:
            k_cache[p] = torch.randn(page, hkv, d, generator=gen, device="cuda")
            v_cache[p] = torch.randn(page, hkv, d, generator=gen, device="cuda")
    q = torch.randn(len(lens), 32, d, generator=gen, device="cuda").to(torch.bfloat16)
    lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    yield q, k_cache, v_cache, lens, table.to("cuda"), ids
    del k_cache, v_cache
    torch.cuda.empty_cache()


@pytest.mark.parametrize("backend", ["auto", "triton", "triton_splitk", "triton_tma"])
def test_pool_past_int32_offsets(backend, pool_past_int32):
    from flashdecode.check import output_tolerance as tolerance
    from flashdecode.reference import reference_dense
    from flashdecode.triton_common import cache_offsets_fit_int32

    args = pool_past_int32[:5]
    assert not cache_offsets_fit_int32(args[1], args[2])
    ref_out, _ = reference_dense(*args, device="cuda")
    out = torch.full_like(args[0], float("nan"))
    decode_attention(*args, backend=backend, out=out)
    assert max_err(out, ref_out) <= tolerance(args, ref_out), backend


def test_append_past_int32_offsets(pool_past_int32):
    from flashdecode import append_kv

    _, k_cache, v_cache, _, _, spare = pool_past_int32
    page = k_cache.shape[1]
    slots = torch.tensor([spare[0] * page + 3, spare[1] * page + 15, -1], dtype=torch.int32, device="cuda")
    k = torch.randn(3, 8, 128, device="cuda").to(torch.bfloat16)
    v = torch.randn_like(k)
    append_kv(k, v, k_cache, v_cache, slots, backend="triton")
    for i, (p, r) in enumerate([(spare[0], 3), (spare[1], 15)]):
        assert torch.equal(k_cache[p, r], k[i]) and torch.equal(v_cache[p, r], v[i])
    assert k_cache[spare[0], 2].isnan().all() and k_cache[spare[1], 14].isnan().all()
