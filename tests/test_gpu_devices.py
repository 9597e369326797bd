"""Where a call runs. Tensors on a GPU other than the current one, as in a model split over GPUs in one process
(transformers' ``device_map="auto"`` keeps cuda:0 current while later layers sit on cuda:1): Triton launches on the
current device, so every entry point that launches a kernel must switch to its tensors' device; those tests run
their calls with cuda:0 current on tensors of cuda:1. And a call under ``torch.cuda.stream(s)`` must run on s,
after the work queued there before it, first calls and replays alike. And a batch past a CUDA grid's 65535 on
dim 1 runs (in slices). Each compares with the float64 reference (or the torch path)."""

import pytest
import torch
from helpers import case, lse_err, lse_tolerance, max_err, output_tolerance, reference_of

from flashdecode import append_kv, decode_attention, plan_decode
from flashdecode.cases import PagedCase
from flashdecode.distributed import merge_gathered

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs in one process")
one_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
DECODE_BACKENDS = ["auto", "auto_plan", "triton", "triton_splitk", "triton_tma", "torch_sdpa"]

OTHER = "cuda:1"


def _skip_without_tma(backend, device):
    if backend == "triton_tma" and torch.cuda.get_device_capability(device)[0] < 9:
        pytest.skip("triton_tma needs compute capability >= 9.0")


def _decode_kwargs(backend, c):
    if backend == "auto_plan":
        return dict(backend="auto", plan=plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table))
    return dict(backend=backend)


@two_gpus
@pytest.mark.parametrize("backend", DECODE_BACKENDS)
def test_decode_on_the_second_gpu_while_the_first_is_current(backend):
    _skip_without_tma(backend, 1)
    # ragged lengths with a long one (split-K), NaN in the unused pages and past each sequence in the table
    c = case([0, 1, 17, 3000, 250], 16, 2, 128, 16, torch.bfloat16, OTHER, seed=11)
    ref_out, ref_lse = reference_of(c)
    tol_out, tol_lse = output_tolerance(c, ref_out, torch.bfloat16), lse_tolerance(c, ref_lse)
    with torch.cuda.device(0):
        kwargs = _decode_kwargs(backend, c)
        for call in range(3):  # the first call records its launches, the later ones replay them (launcher.py)
            out = torch.full_like(c.q, float("nan"))
            got, lse = decode_attention(*c.args, out=out, return_lse=True, **kwargs)
            torch.cuda.synchronize(1)
            assert got.device == torch.device(OTHER) and lse.device == torch.device(OTHER)
            assert max_err(got, ref_out) <= tol_out, (backend, call)
            assert lse_err(lse, ref_lse) <= tol_lse, (backend, call)
        assert torch.cuda.current_device() == 0, "the call left cuda:0 current"


@two_gpus
def test_append_on_the_second_gpu_while_the_first_is_current():
    k_cache = torch.zeros(6, 4, 2, 32, dtype=torch.bfloat16, device=OTHER)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(5, 2, 32, dtype=torch.bfloat16, device=OTHER)
    v = torch.randn_like(k)
    slots = torch.tensor([0, 7, -1, 13, 23], dtype=torch.int32, device=OTHER)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    append_kv(k, v, want_k, want_v, slots, backend="torch")
    with torch.cuda.device(0):
        for _ in range(2):  # recorded, then replayed
            got_k, got_v = k_cache.clone(), v_cache.clone()
            append_kv(k, v, got_k, got_v, slots, backend="triton")
            torch.cuda.synchronize(1)
            assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
        assert torch.cuda.current_device() == 0


@two_gpus
def test_triton_merge_on_the_second_gpu_while_the_first_is_current():
    gen = torch.Generator(device=OTHER).manual_seed(5)
    gathered = torch.randn(3, 4, 8, 65, device=OTHER, generator=gen)
    gathered[1, 2, :, -1] = float("-inf")  # one rank without tokens for one sequence
    gathered[1, 2, :, :-1] = float("nan")
    want_out, want_lse = merge_gathered(gathered, torch.float32, merge="torch")
    with torch.cuda.device(0):
        out, lse = merge_gathered(gathered, torch.float32, merge="triton")
        torch.cuda.synchronize(1)
        assert torch.cuda.current_device() == 0
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)


@one_gpu
@pytest.mark.parametrize("backend", DECODE_BACKENDS)
def test_decode_on_a_side_stream_runs_after_the_work_queued_there(backend):
    """On a side stream: a ~20 ms sleep, then q's values copied in (q holds NaN until then), then the call. A kernel
    launched on another stream would read the NaN q at once."""
    _skip_without_tma(backend, 0)
    c = case([0, 1, 17, 3000, 250], 16, 2, 128, 16, torch.bfloat16, "cuda", seed=12)
    ref_out, ref_lse = reference_of(c)
    tol_out, tol_lse = output_tolerance(c, ref_out, torch.bfloat16), lse_tolerance(c, ref_lse)
    kwargs = _decode_kwargs(backend, c)
    q_values = c.q.clone()
    side = torch.cuda.Stream()
    for call in range(3):  # recorded, then replayed (launcher.py)
        c.q.fill_(float("nan"))
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(40_000_000)  # GPU cycles: ~20 ms at the H200's clock
            c.q.copy_(q_values)
            out, lse = decode_attention(*c.args, return_lse=True, **kwargs)
        side.synchronize()
        assert max_err(out, ref_out) <= tol_out, (backend, call)
        assert lse_err(lse, ref_lse) <= tol_lse, (backend, call)


@one_gpu
def test_append_on_a_side_stream_runs_after_the_work_queued_there():
    k_cache = torch.zeros(6, 4, 2, 32, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(5, 2, 32, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    slots = torch.tensor([0, 7, -1, 13, 23], dtype=torch.int32, device="cuda")
    want_k, want_v = k_cache.clone(), v_cache.clone()
    append_kv(k, v, want_k, want_v, slots, backend="torch")
    k_values = k.clone()
    side = torch.cuda.Stream()
    for _ in range(2):  # recorded, then replayed
        got_k, got_v = k_cache.clone(), v_cache.clone()
        k.fill_(float("nan"))
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(40_000_000)
            k.copy_(k_values)
            append_kv(k, v, got_k, got_v, slots, backend="triton")
        side.synchronize()
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


@one_gpu
@pytest.mark.parametrize("backend", ["auto", "triton", "triton_splitk", "triton_tma"])
def test_batch_past_the_grid_limit_runs_in_slices(backend):
    """70000 sequences: past a CUDA grid's 65535 on dim 1, where the kernels put the sequences; the call runs in
    slices of api.MAX_LAUNCH_BATCH. 120 rows (the first, the last, and random ones) against the float64 reference."""
    _skip_without_tma(backend, 0)
    batch = 70000
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(0, 41, (batch,), generator=gen).tolist()
    c = case(lengths, 4, 2, 64, 16, torch.bfloat16, "cuda", seed=13)
    out, lse = decode_attention(*c.args, backend=backend, return_lse=True)
    rows = [torch.arange(40), torch.randint(40, batch - 40, (40,), generator=gen), torch.arange(batch - 40, batch)]
    rows = torch.cat(rows).to("cuda")
    sub = PagedCase(c.q[rows], c.k_cache, c.v_cache, c.cache_seqlens[rows], c.block_table[rows])
    ref_out, ref_lse = reference_of(sub)
    assert max_err(out[rows], ref_out) <= output_tolerance(sub, ref_out, torch.bfloat16)
    assert lse_err(lse[rows], ref_lse) <= lse_tolerance(sub, ref_lse)
