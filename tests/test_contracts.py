"""The rows of docs/contracts.md that no other test file holds: odd inputs, each against the float64 reference.

Every kernel result is compared with ``reference_dense`` under the tolerance of tests/helpers.py (2 x plain
PyTorch's error at the same precision + 1 ulp); rows with extreme logits compute that bar on an equivalent
well-scaled input where the same-precision PyTorch math itself would overflow.
"""

import pytest
import torch
from helpers import case, lse_err, lse_tolerance, max_err, output_tolerance, reference_of

import flashdecode.api as api
from flashdecode import BACKENDS, decode_attention, plan_decode
from flashdecode.env import env_flag
from flashdecode.reference import gather_sequence
from flashdecode.triton_common import launch_config

# "auto" resolves to one of these two (tests/test_splitk.py::test_auto_rule)
KERNELS = ("triton", "triton_splitk")


@pytest.fixture
def no_launch(monkeypatch):
    """Fail the test if any backend runs: the check must come before any launch."""
    for name in list(api._BACKEND_FNS):
        monkeypatch.setitem(api._BACKEND_FNS, name, lambda *a, _n=name: pytest.fail(f"backend {_n} launched"))


def _assert_matches_reference(c, out, lse=None, *, tolerance_case=None, **kwargs):
    """out (and lse) against the float64 reference of case c; the tolerance comes from tolerance_case (default c)."""
    ref_out, ref_lse = reference_of(c, **kwargs)
    tol_case, tol_kwargs = tolerance_case or (c, kwargs)
    tol = output_tolerance(tol_case, ref_out, c.q.dtype, **tol_kwargs)
    err = max_err(out, ref_out)
    assert err <= tol, f"max |out - ref| = {err:.3g} > tolerance {tol:.3g}"
    if lse is not None:
        tol = lse_tolerance(tol_case, ref_lse, **tol_kwargs)
        err = lse_err(lse, ref_lse)
        assert err <= tol, f"max |lse - ref| = {err:.3g} > tolerance {tol:.3g}"
    return ref_out, ref_lse


def _pages_read(c):
    page = c.k_cache.shape[1]
    return [-(-int(n) // page) for n in c.cache_seqlens.tolist()]


# ---- lengths ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("group", [1, 4], ids=["G1", "G4"])
@pytest.mark.parametrize("backend", ["triton", "triton_splitk"])
def test_lengths_on_tile_and_page_edges(backend, group, device):
    """Lengths exactly one and two tiles (BLOCK_N, a multiple of the page), one less and one more."""
    block_n = launch_config(64, group, torch.bfloat16)["BLOCK_N"]
    lens = [block_n - 1, block_n, block_n + 1, 2 * block_n]
    c = case(lens, 2 * group, 2, 64, 16, torch.bfloat16, device, seed=21)
    kwargs = dict(num_splits=2) if backend == "triton_splitk" else {}
    out = torch.full_like(c.q, float("nan"))
    out, lse = decode_attention(*c.args, backend=backend, return_lse=True, out=out, **kwargs)
    _assert_matches_reference(c, out, lse)


# ---- the block table ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", KERNELS)
def test_table_entries_past_the_sequence_are_never_read(backend, device):
    """Past each sequence the table holds -1, 0, INT32_MAX and num_pages; page 0 is an unused page full of NaN, so
    a read of entry 0 would show up as NaN in the output."""
    c = case([5, 16, 0, 40], 8, 2, 64, 16, torch.float16, device, seed=22)
    num_pages = c.k_cache.shape[0]
    used = {int(p) for b, n in enumerate(_pages_read(c)) for p in c.block_table[b, :n].tolist()}
    spare = next(p for p in range(num_pages) if p not in used)
    # swap page 0 with an unused (NaN) page, and rename the table entries to match
    order = torch.arange(num_pages, device=device)
    order[0], order[spare] = spare, 0
    k, v = c.k_cache[order], c.v_cache[order]
    assert torch.isnan(k[0]).all()
    table = c.block_table.clone()
    fill = torch.tensor([-1, 0, 2**31 - 1, num_pages], dtype=torch.int32, device=device)
    for b, n in enumerate(_pages_read(c)):
        row = c.block_table[b, :n]
        table[b, :n] = torch.where(row == 0, spare, torch.where(row == spare, 0, row))
        past = table.shape[1] - n
        table[b, n:] = fill.repeat(past // 4 + 1)[:past]
    moved = type(c)(c.q, k, v, c.cache_seqlens, table)
    out, lse = decode_attention(*moved.args, backend=backend, return_lse=True)
    _assert_matches_reference(moved, out, lse)


@pytest.mark.parametrize("backend", KERNELS)
def test_duplicate_page_ids_are_honoured(backend, device):
    """Two sequences sharing their first pages (prefix caching) and one sequence reading one page twice give the
    reference answer: the kernels do not assume distinct pages."""
    c = case([40, 40, 30], 8, 2, 64, 16, torch.bfloat16, device, seed=23)
    table = c.block_table.clone()
    table[1, :2] = table[0, :2]  # sequence 1 shares sequence 0's first 32 tokens
    table[2, 1] = table[2, 0]  # sequence 2 reads its first page twice
    shared = type(c)(c.q, c.k_cache, c.v_cache, c.cache_seqlens, table)
    out, lse = decode_attention(*shared.args, backend=backend, return_lse=True)
    _assert_matches_reference(shared, out, lse)


@pytest.mark.parametrize("backend", KERNELS)
def test_non_contiguous_metadata_is_honoured(backend, device):
    """cache_seqlens every other element of a longer tensor, block_table every other column of a wider one."""
    c = case([7, 30, 0, 50], 8, 2, 64, 8, torch.float16, device, seed=24)
    lens = torch.zeros(8, dtype=torch.int32, device=device)
    lens[::2] = c.cache_seqlens
    wide = torch.full((4, 2 * c.block_table.shape[1]), -1, dtype=torch.int32, device=device)
    wide[:, ::2] = c.block_table
    assert not lens[::2].is_contiguous() and not wide[:, ::2].is_contiguous()
    out = decode_attention(c.q, c.k_cache, c.v_cache, lens[::2], wide[:, ::2], backend=backend)
    assert torch.equal(out, decode_attention(*c.args, backend=backend))
    _assert_matches_reference(c, out)


# ---- stale and unused pages -----------------------------------------------------------------------------------


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("backend", KERNELS)
def test_stale_tails_and_unused_pages_do_not_leak(backend, poison, device):
    """Unused pages and the rows past each sequence's end in its last page hold NaN / Inf: the output is finite and
    matches the reference (masked loads, never 0 * NaN)."""
    page = 16
    c = case([3, 17, 0, 45], 8, 2, 64, page, torch.bfloat16, device, seed=25, poison=poison)
    for b, n in enumerate(c.cache_seqlens.tolist()):
        if n % page:
            last = int(c.block_table[b, n // page])
            c.k_cache[last, n % page :] = poison
            c.v_cache[last, n % page :] = poison
    out, lse = decode_attention(*c.args, backend=backend, return_lse=True, num_splits=None)
    assert torch.isfinite(out).all()
    _assert_matches_reference(c, out, lse)


# ---- extreme logits -------------------------------------------------------------------------------------------


def _offset_logits(c, offset):
    """Scores = offset + O(1) for every token: dim 0 of every key is 1, of every query offset / scale; the other
    dims are shrunk so that they add a spread of a few units. Returns (case, softmax_scale)."""
    scale = 1000.0
    k, q = c.k_cache.clone(), c.q.clone()
    k[..., 1:] *= 0.0002
    k[..., 0] = 1.0
    q[..., 0] = offset / scale
    return type(c)(q, k, c.v_cache, c.cache_seqlens, c.block_table), scale


@pytest.mark.parametrize("offset", [-1e5, 1e3], ids=["logits-1e5", "logits+1e3"])
@pytest.mark.parametrize("backend", KERNELS)
def test_extreme_finite_logits(backend, offset, device):
    """Logits near -1e5 after scaling (far below any finite masking value) still count: out is the softmax over
    them, lse ~ -1e5. Logits near +1e3 would overflow exp (in fp32 and float64) without the running max."""
    base = case([1, 20, 130], 8, 2, 64, 16, torch.float32, device, seed=26)
    c, scale = _offset_logits(base, offset)
    out, lse = decode_attention(*c.args, backend=backend, softmax_scale=scale, return_lse=True)
    ref_out, ref_lse = _assert_matches_reference(c, out, lse, softmax_scale=scale)
    # the bar must stay meaningful: far below what ignoring the tokens (out = 0) would cost
    assert output_tolerance(c, ref_out, torch.float32, softmax_scale=scale) < 0.1 * float(ref_out.abs().max())
    assert abs(float(ref_lse[0].max()) - offset) < 50


@pytest.mark.parametrize("backend", KERNELS)
def test_fp16_products_beyond_fp16_range(backend, device):
    """fp16 q . k beyond 65504 (the fp16 maximum) with moderate scaled scores: products accumulate in fp32.

    The bar is plain PyTorch's fp16 error on the same problem with q / 256 and softmax_scale x 256 (exact powers of
    two, so the same scores), where fp16 PyTorch does not overflow."""
    small = case([5, 33, 100], 8, 2, 64, 16, torch.float16, device, seed=27)
    k = (small.k_cache.float() * 50).half()
    q = small.q * 256
    scale = 1.0 / 25600
    big = type(small)(q, k, small.v_cache, small.cache_seqlens, small.block_table)
    scaled = type(small)(small.q, k, small.v_cache, small.cache_seqlens, small.block_table)
    # [B, pages, page_size]: q head 0 against KV head 0 in float64 (spare pages are NaN)
    products = torch.einsum("bd,ptd->bpt", q[:, 0].double(), k[:, :, 0].double()).abs().nan_to_num(0.0)
    assert products.max() > 65504, "the case must overflow fp16 dot products"
    out = decode_attention(*big.args, backend=backend, softmax_scale=scale)
    assert torch.isfinite(out).all()
    _assert_matches_reference(big, out, softmax_scale=scale, tolerance_case=(scaled, dict(softmax_scale=scale * 256)))


# ---- out= -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", KERNELS + ("torch_sdpa",))
def test_out_aliasing_q_is_honoured(backend, device):
    """out=q: every program reads its group's q rows before it writes the same out rows, and no other program reads
    them (split-K: partials read q, the combine writes out in a later launch)."""
    c = case([3, 60, 0, 130], 8, 2, 64, 16, torch.bfloat16, device, seed=28)
    q = c.q.clone()
    result = decode_attention(q, *c.args[1:], backend=backend, out=q)
    assert result.data_ptr() == q.data_ptr()
    _assert_matches_reference(c, q)
    for splits in (3,) if backend == "triton_splitk" else ():
        q = c.q.clone()
        decode_attention(q, *c.args[1:], backend=backend, out=q, num_splits=splits)
        _assert_matches_reference(c, q)


def _shifted_view(t, elements):
    """A view of t's storage with t's shape, starting ``elements`` later: overlaps t without being t."""
    base = torch.empty(t.numel() + elements, dtype=t.dtype, device=t.device)
    base[: t.numel()] = t.reshape(-1)
    return base[: t.numel()].view(t.shape), base[elements:].view(t.shape)


def test_out_overlapping_an_input_is_refused(device, no_launch):
    c = case([5, 20], 8, 2, 64, 16, torch.float16, device)
    q, out = _shifted_view(c.q, 64)
    with pytest.raises(ValueError, match="out must not share memory with q"):
        decode_attention(q, *c.args[1:], out=out)
    # the same storage with other strides is not out=q either
    with pytest.raises(ValueError, match="out must not share memory with q"):
        decode_attention(*c.args, out=c.q.as_strided(c.q.shape, (64, 128, 1)))
    pages = c.k_cache.view(-1)[: c.q.numel()].view(c.q.shape)
    with pytest.raises(ValueError, match="out must not share memory with k_cache"):
        decode_attention(*c.args, out=pages)
    # out a tensor subclass: the check reads the addresses itself (the cached launcher's list is not made)
    with pytest.raises(ValueError, match="out must not share memory with k_cache"):
        decode_attention(*c.args, out=pages.as_subclass(_Marked))


def test_out_overlapping_itself_or_a_feature_tensor_is_refused(device, monkeypatch):
    """Overlaps the address check of q .. block_table missed, each accepted with a wrong result before: an out with
    a stride-0 (or interleaved) dim, out=q with q such a view, and sinks / ALiBi slopes inside out's memory."""
    launched = []
    for name in list(api._BACKEND_FNS):
        monkeypatch.setitem(api._BACKEND_FNS, name, lambda *a, _n=name: launched.append(_n))
    c = case([5, 20], 8, 2, 64, 16, torch.float32, device)
    expanded = c.q[:1].clone().expand(c.q.shape)
    for out, q in ((torch.empty_like(c.q[:1]).expand(c.q.shape), c.q), (expanded, expanded)):
        with pytest.raises(ValueError, match=r"out's strides \(0, 64, 1\) .* may give two elements one address"):
            decode_attention(q, *c.args[1:], out=out)
    with pytest.raises(ValueError, match="may give two elements one address"):  # rows interleaved with each other
        decode_attention(*c.args, out=torch.empty(64 * 9, device=device).as_strided(c.q.shape, (64, 64, 1)))
    for name in ("sinks", "alibi_slopes"):
        out = torch.zeros_like(c.q)
        with pytest.raises(ValueError, match=f"out must not share memory with {name}"):
            decode_attention(*c.args, out=out, **{name: out.view(-1)[64 : 64 + 8]})
    assert launched == []
    decode_attention(*c.args, out=torch.zeros_like(c.q), sinks=torch.zeros(8, device=device))  # separate: fine
    assert len(launched) == 1


class _Marked(torch.Tensor):
    """A tensor subclass with nothing added."""


def test_out_overlap_is_checked_on_every_call(device, monkeypatch):
    """The metadata checks are skipped for metadata already validated (api._validate memoises them); the address
    check is not: the same shapes, strides and dtypes with an out that now overlaps an input are refused."""
    for name in list(api._BACKEND_FNS):
        monkeypatch.setitem(api._BACKEND_FNS, name, lambda *a: None)
    c = case([5, 20], 8, 2, 64, 16, torch.float16, device)
    pages = c.k_cache.view(-1)[: c.q.numel()].view(c.q.shape)
    separate = torch.empty_strided(pages.shape, pages.stride(), dtype=pages.dtype, device=device)
    for _ in range(2):
        decode_attention(*c.args, out=separate)
        with pytest.raises(ValueError, match="out must not share memory with k_cache"):
            decode_attention(*c.args, out=pages)
        decode_attention(*c.args, out=c.q)


def test_out_on_another_device_is_refused(device, no_launch):
    c = case([5, 20], 8, 2, 64, 16, torch.float16, device)
    with pytest.raises(ValueError, match="out must be on q's device"):
        decode_attention(*c.args, out=torch.empty(c.q.shape, dtype=c.q.dtype, device="meta"))


@pytest.mark.parametrize("backend", KERNELS)
def test_repeated_calls_with_changing_shapes_and_a_reused_buffer(backend, device):
    """One NaN-filled buffer serves calls of different batch, heads and head dims through views of it: each call
    matches the reference and writes nothing outside its view."""
    buffer = torch.full((4, 16, 128), float("nan"), dtype=torch.float16, device=device)
    shapes = [([30, 0, 7], 8, 2, 64), ([100], 16, 4, 128), ([1, 2, 3, 64], 6, 3, 32), ([30, 0, 7], 8, 2, 64)]
    for i, (lens, hq, hkv, d) in enumerate(shapes):
        buffer.fill_(float("nan"))
        c = case(lens, hq, hkv, d, 16, torch.float16, device, seed=30 + i)
        view = buffer[: len(lens), :hq, :d]
        decode_attention(*c.args, backend=backend, out=view)
        _assert_matches_reference(c, view)
        outside = torch.ones_like(buffer, dtype=torch.bool)
        outside[: len(lens), :hq, :d] = False
        assert torch.isnan(buffer[outside]).all(), f"call {i} wrote outside its out view"


# ---- validate=True / FLASHDECODE_DEBUG=1 -------------------------------------------------------------------------


def _with_table(c, table=None, lens=None):
    return type(c)(c.q, c.k_cache, c.v_cache, c.cache_seqlens if lens is None else lens,
                   c.block_table if table is None else table)  # fmt: skip


@pytest.fixture
def valid(device):
    """Shuffled pages, NaN spare pages, -1 and garbage past every sequence: valid as it is."""
    return case([5, 20, 0, 33], 8, 2, 64, 16, torch.float16, device, seed=31)


def test_validate_accepts_a_valid_case(valid):
    out = decode_attention(*valid.args, validate=True, backend="triton")
    assert torch.equal(out, decode_attention(*valid.args, backend="triton"))


def _bad_cases(c):
    """{what: (case, message)} for each value error, each built from the valid case c."""
    num_pages, width = c.k_cache.shape[0], c.block_table.shape[1]
    lens, table = c.cache_seqlens, c.block_table
    bad = {}
    negative = lens.clone()
    negative[1] = -20
    bad["negative length"] = _with_table(c, lens=negative), r"cache_seqlens\[1\] must be >= 0, got -20"
    too_long = lens.clone()
    too_long[3] = width * 16 + 1
    bad["table too narrow"] = _with_table(c, lens=too_long), (
        rf"cache_seqlens\[3\] = {width * 16 + 1} needs {width + 1} pages of 16 tokens, but block_table has {width} "
        rf"columns \(at most {width * 16} tokens\)"
    )
    for what, page in (("page -1", -1), ("page past the pool", num_pages)):
        t = table.clone()
        t[1, 1] = page
        bad[what] = _with_table(c, table=t), (
            rf"block_table\[1, 1\] = {page} is not a page id in \[0, {num_pages}\); sequence 1 has 20 tokens, so "
            r"its first 2 entries are read"
        )
    t = table.clone()
    t[3, 2] = t[0, 0]
    bad["shared page"] = _with_table(c, table=t), (
        rf"page {int(t[0, 0])} is read by block_table\[0, 0\] and block_table\[3, 2\]; pass allow_shared_pages=True"
    )
    return bad


@pytest.mark.parametrize("what", ["negative length", "table too narrow", "page -1", "page past the pool", "shared page"])
def test_validate_names_the_bad_value(valid, no_launch, what, monkeypatch):
    c, message = _bad_cases(valid)[what]
    with pytest.raises(ValueError, match=message):
        decode_attention(*c.args, validate=True)
    # FLASHDECODE_DEBUG=1 turns it on for every call
    monkeypatch.setenv("FLASHDECODE_DEBUG", "1")
    with pytest.raises(ValueError, match=message):
        decode_attention(*c.args)


def test_validate_allows_shared_pages_when_asked(valid, device):
    table = valid.block_table.clone()
    table[3, :2] = table[1, :2]  # prefix caching: sequence 3 starts with sequence 1's pages
    c = _with_table(valid, table=table)
    out, lse = decode_attention(*c.args, validate=True, allow_shared_pages=True, backend="triton", return_lse=True)
    _assert_matches_reference(c, out, lse)


def test_validation_is_off_by_default(valid, monkeypatch):
    """Without validate or FLASHDECODE_DEBUG the values are not all checked: the shared-page test never runs, and the
    bounds checks only where the values are on the host anyway, CPU tensors and the backends that read them there
    (the default path has no host sync; test_gpu.py::test_no_host_sync holds that on the GPU)."""
    monkeypatch.delenv("FLASHDECODE_DEBUG", raising=False)
    calls, bounds = [], []
    monkeypatch.setattr(api.validation, "check_values", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(api.validation, "check_bounds", lambda *a, **k: bounds.append(a))
    on_cpu = valid.q.device.type == "cpu"
    decode_attention(*valid.args, backend="torch_sdpa")
    for off in ("0", "false", "Off"):
        monkeypatch.setenv("FLASHDECODE_DEBUG", off)
        decode_attention(*valid.args, backend="torch_sdpa")
    assert calls == []
    assert len(bounds) == (4 if on_cpu else 0)
    for backend in api.HOST_READ_BACKENDS:
        decode_attention(*valid.args, backend=backend)
    assert len(bounds) == (6 if on_cpu else 2)
    decode_attention(*valid.args, backend="torch_sdpa", validate=True)
    assert len(calls) == 1
    monkeypatch.setenv("FLASHDECODE_DEBUG", "yes")
    decode_attention(*valid.args, backend="torch_sdpa")
    assert len(calls) == 2 and len(bounds) == (6 if on_cpu else 2)


BOUNDS = ["negative length", "table too narrow", "page -1", "page past the pool"]


@pytest.mark.parametrize("what", BOUNDS)
def test_bounds_checked_where_the_values_are_on_the_host(valid, no_launch, what, monkeypatch):
    """Without validate: on CPU tensors every backend, on any device "reference" and "torch_naive", raise the
    validate=True error for a read outside the table or the pool (a kernel would read out of bounds, under the
    interpreter a crash)."""
    monkeypatch.delenv("FLASHDECODE_DEBUG", raising=False)
    c, message = _bad_cases(valid)[what]
    backends = BACKENDS if valid.q.device.type == "cpu" else api.HOST_READ_BACKENDS
    for backend in backends:
        with pytest.raises(ValueError, match=message):
            decode_attention(*c.args, backend=backend)


def test_shared_pages_pass_the_bounds_checks(valid, device, monkeypatch):
    """A page read twice is only an error with validate=True: the default checks on CPU take prefix caching."""
    monkeypatch.delenv("FLASHDECODE_DEBUG", raising=False)
    c, _ = _bad_cases(valid)["shared page"]
    out, lse = decode_attention(*c.args, backend="reference", return_lse=True)
    _assert_matches_reference(c, out, lse)


def test_bounds_skip_pages_before_the_window_and_name_a_dense_cache(valid, monkeypatch):
    """A window's pages wholly before it are not read: -1 there passes the default checks (and validate=True), -1
    inside it does not; a dense cache's too-long length names its max_len, not a block_table it was never given."""
    monkeypatch.delenv("FLASHDECODE_DEBUG", raising=False)
    table = valid.block_table.clone()
    table[3, 0] = -1  # sequence 3 (33 tokens, page 16): a window of 8 starts at token 25, in page 1
    c = _with_table(valid, table=table)
    out = decode_attention(*c.args, backend="reference", window_left=8)
    assert torch.equal(out, decode_attention(*valid.args, backend="reference", window_left=8))
    decode_attention(*c.args, backend="reference", window_left=8, validate=True)
    table[3, 2] = -1
    with pytest.raises(ValueError, match=r"block_table\[3, 2\] = -1 .* its entries 1 to 2 \(the window's\) are read"):
        decode_attention(*_with_table(valid, table=table).args, backend="reference", window_left=8)
    lens = torch.tensor([5, 40], dtype=torch.int32, device=valid.q.device)
    k = valid.k_cache[:2, :, :, :].reshape(2, 16, 2, 64).contiguous()
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 40 is more than the dense k_cache holds per sequence "
                                         r"\(max_len 16, its dim 1\)"):
        decode_attention(valid.q[:2], k, k, lens, None, backend="reference")


def test_auto_takes_the_pytorch_path_above_the_triton_head_dims(device):
    """head_dim 512: `auto` (and a plan) run torch_sdpa, or torch_naive for the features; both match the reference."""
    c = case([5, 40], 4, 2, 512, 16, torch.float32, device, seed=2)
    assert api._choose_backend("auto", None, c.q, c.k_cache, c.block_table)[0] == "torch_sdpa"
    out, lse = decode_attention(*c.args, return_lse=True)
    _assert_matches_reference(c, out, lse)
    assert torch.equal(out, decode_attention(*c.args, backend="torch_sdpa"))
    out = decode_attention(*c.args, softcap=30.0)
    assert torch.equal(out, decode_attention(*c.args, backend="torch_naive", softcap=30.0))
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert plan.backend == "torch_sdpa", plan
    assert torch.equal(decode_attention(*c.args, plan=plan), decode_attention(*c.args, backend="torch_sdpa"))


@pytest.mark.parametrize("backend", ["auto", "triton", "triton_splitk"])
def test_inputs_requiring_grad_give_the_same_values_and_no_graph(backend, device):
    """Forward only: a q (or cache) that requires grad gives the values of its detached copy, and an output without
    an autograd graph (no backward exists to attach)."""
    c = case([5, 40], 4, 2, 32, 16, torch.float32, device, seed=4)
    q, k = c.q.clone().requires_grad_(), c.k_cache.clone().requires_grad_()
    out = decode_attention(q, k, *c.args[2:], backend=backend)
    assert not out.requires_grad and out.grad_fn is None
    assert torch.equal(out, decode_attention(*c.args, backend=backend))


@pytest.mark.parametrize("backend", ["auto", "triton", "triton_splitk"])
def test_batches_past_the_launch_limit_run_in_slices(backend, device, monkeypatch):
    """More sequences than api.MAX_LAUNCH_BATCH (a CUDA grid's dim 1 holds 65535; 3 here): the backend runs on slices
    of at most that many, into one out and lse (also out = q, and a dense HND cache), and a plan is refused. On the
    H200 at the real limit: tests/test_gpu_devices.py::test_batch_past_the_grid_limit_runs_in_slices."""
    c = case([0, 1, 17, 9, 5, 13, 16, 2], 4, 2, 32, 4, torch.float32, device, seed=9)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    monkeypatch.setattr(api, "MAX_LAUNCH_BATCH", 3)
    rows = []  # the batch of every backend call
    for fn_name, fn in list(api._BACKEND_FNS.items()):
        def spy(q, *args, _fn=fn, **kwargs):
            rows.append(q.shape[0])
            return _fn(q, *args, **kwargs)
        monkeypatch.setitem(api._BACKEND_FNS, fn_name, spy)
    # fixed splits for triton_splitk: the planned grid's empty slots cost the interpreter ~10 s here
    options = dict(backend=backend, num_splits=2 if backend == "triton_splitk" else None)
    out = torch.full_like(c.q, float("nan"))
    got, lse = decode_attention(*c.args, out=out, return_lse=True, **options)
    assert got is out and rows == [3, 3, 2], rows
    _assert_matches_reference(c, out, lse)
    q = c.q.clone()
    assert torch.equal(decode_attention(q, *c.args[1:], out=q, **options), out)
    # a dense HND cache [B, Hkv, max_len, D]: each slice reads its rows of the whole cache
    dense = [torch.full((8, 2, 20, 32), float("nan"), device=device) for _ in range(2)]
    for cache, d in zip((c.k_cache, c.v_cache), dense):
        for b, n in enumerate(c.cache_seqlens.tolist()):
            d[b, :, :n] = gather_sequence(cache, c.block_table[b], n).transpose(0, 1)
    rows.clear()
    got = decode_attention(c.q, *dense, c.cache_seqlens, None, kv_layout="HND", **options)
    assert rows == [3, 3, 2], rows
    _assert_matches_reference(c, got)
    # an out overlapping another slice's q rows (q shifted by 3 rows) is refused, as unsliced
    buf = torch.zeros(11, *c.q.shape[1:], device=device)
    with pytest.raises(ValueError, match="out must not share memory with q"):
        decode_attention(buf[:-3], *c.args[1:], out=buf[3:], **options)
    # shared pages (prefix caching) across slices, checked on the whole batch and, under FLASHDECODE_DEBUG, per slice
    table = c.block_table.clone()
    table[4, 0] = table[3, 0]  # in one slice
    table[7, 0] = table[2, 0]  # across two
    monkeypatch.setenv("FLASHDECODE_DEBUG", "1")
    shared = decode_attention(c.q, c.k_cache, c.v_cache, c.cache_seqlens, table, validate=True, allow_shared_pages=True,
                              **options)  # fmt: skip
    keep = [0, 1, 2, 3, 5, 6]
    assert torch.equal(shared[keep], out[keep])
    monkeypatch.delenv("FLASHDECODE_DEBUG")
    with pytest.raises(ValueError, match=r"plan_decode takes at most 3 sequences \(api.MAX_LAUNCH_BATCH\), got 8"):
        plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    if backend == "auto":
        with pytest.raises(ValueError, match=r"a plan takes at most 3 sequences \(api.MAX_LAUNCH_BATCH\), got 8"):
            decode_attention(*c.args, plan=plan)


@pytest.mark.parametrize("value,on", [("0", False), ("false", False), ("No", False), (" OFF ", False),
                                      ("1", True), ("yes", True), ("true", True), ("2", True)])
def test_env_flags_read_one_way(value, on, monkeypatch):
    monkeypatch.setenv("FLASHDECODE_TEST_FLAG", value)
    assert env_flag("FLASHDECODE_TEST_FLAG", not on) is on
    # unset or empty: the default
    for unset in (None, "", " "):
        if unset is None:
            monkeypatch.delenv("FLASHDECODE_TEST_FLAG")
        else:
            monkeypatch.setenv("FLASHDECODE_TEST_FLAG", unset)
        assert env_flag("FLASHDECODE_TEST_FLAG", on) is on and env_flag("FLASHDECODE_TEST_FLAG", not on) is not on


def test_validate_must_be_a_bool(valid, no_launch):
    with pytest.raises(TypeError, match="validate must be a bool, got str"):
        decode_attention(*valid.args, validate="yes")


def test_contract_table_names_real_tests():
    """Every `file.py::test_name` in docs/contracts.md is a test function of that file."""
    import pathlib
    import re

    tests = pathlib.Path(__file__).parent
    doc = (tests.parent / "docs" / "contracts.md").read_text()
    named = set(re.findall(r"`(test_\w+\.py)::(test_\w+)", doc))
    assert len(named) >= 20
    for filename, name in sorted(named):
        assert re.search(rf"^def {name}\(", (tests / filename).read_text(), re.M), f"{filename}::{name} not found"
