"""Context-parallel decode (flashdecode.distributed) against the single-process result and the float64 reference.

Multi-process tests spawn 2 or 3 processes with gloo on the CPU; each process runs every case of ``CASES`` over
one process group (a spawn costs seconds, a case milliseconds) and saves its results; the parent checks them.
"""

import datetime
import doctest
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import case, lse_err, lse_tolerance, max_err, output_tolerance, reference_of

import flashdecode.distributed
from flashdecode import decode_attention
from flashdecode.distributed import PagedShard, decode_attention_cp, merge_gathered, shard_paged_cache
from flashdecode.reference import gather_sequence, reference_merge_states
from flashdecode.triton_common import interpreting

# (id, seqlens, Hq/Hkv, D, page, dtype, local backend, merge, layout, contiguous weights per world size)
# seqlens include 0 (no token on any rank) and sequences shorter than one page per rank (empty local sequences)
CASES = [
    ("equal-contig-fp32", [37, 64, 5, 0], (6, 2), 32, 8, torch.float32, "torch_sdpa", "torch", "contiguous", None),
    ("round-robin-fp32", [37, 64, 5, 0], (6, 2), 32, 8, torch.float32, "torch_sdpa", "torch", "round_robin", None),
    # weight 0: that rank holds no page at all (an empty pool)
    ("unequal-empty-rank-fp32", [50, 17, 90], (4, 4), 16, 4, torch.float32, "torch_sdpa", "torch", "contiguous",
     {2: [3, 0], 3: [0, 5, 1]}),
    ("round-robin-bf16-triton-merge", [33, 1, 70], (8, 1), 64, 16, torch.bfloat16, "reference", "triton",
     "round_robin", None),
    ("unequal-bf16-4d-q", [29, 48], (4, 2), 32, 4, torch.bfloat16, "torch_sdpa", "torch", "contiguous",
     {2: [1, 4], 3: [2, 1, 3]}),
    ("all-empty", [0, 0], (4, 2), 16, 8, torch.float32, "torch_sdpa", "torch", "contiguous", None),
]  # fmt: skip
# the Triton kernels under the interpreter: ~6 ms per program per loop iteration, so tiny and on 2 ranks only
TRITON_CASES = [
    ("triton-bf16", [20, 9, 0], (4, 2), 16, 8, torch.bfloat16, "triton", "triton", "round_robin", None),
    ("triton-splitk-fp32", [40, 3], (2, 2), 16, 8, torch.float32, "triton_splitk", "torch", "contiguous",
     {2: [1, 2]}),
]  # fmt: skip


def build(spec, world, rank, device="cpu"):
    """(full case, this rank's shard) for a case spec: the same on every rank (seeded)."""
    name, seqlens, (hq, hkv), d, page, dtype, *_, layout, weights = spec
    c = case(seqlens, hq, hkv, d, page, dtype, device, seed=len(name))
    if name.endswith("4d-q"):
        c.q = c.q[:, None]
    shards = shard_paged_cache(*c.args[1:], world, layout=layout, weights=(weights or {}).get(world))
    return c, scramble(shards[rank], seed=rank)


def scramble(shard, seed):
    """Production-like shard: pool pages shuffled, one NaN spare page, -1 / garbage past each sequence."""
    gen = torch.Generator().manual_seed(seed)
    num_pages, page = shard.k_cache.shape[0], shard.k_cache.shape[1]
    # new position of old page i: perm[i]; the spare page is the last position
    perm = torch.randperm(num_pages, generator=gen)
    spare = shard.k_cache.new_full((1, *shard.k_cache.shape[1:]), float("nan"))
    k = torch.cat([torch.empty_like(shard.k_cache), spare])
    v = torch.cat([torch.empty_like(shard.v_cache), spare])
    k[perm.to(k.device)], v[perm.to(v.device)] = shard.k_cache, shard.v_cache
    used = -(-shard.cache_seqlens.cpu() // page)
    table = shard.block_table.cpu().long()
    mapped = torch.where(table >= 0, perm[table.clamp_min(0)], table).to(torch.int32)
    width = table.shape[1] + 1
    padded = torch.full((table.shape[0], width), num_pages + 7, dtype=torch.int32)
    columns = torch.arange(width)[None, :]
    padded[:, : table.shape[1]] = mapped
    padded = torch.where(columns < used[:, None], padded, torch.where(columns % 2 == 0, -1, padded.max() + 1000))
    return PagedShard(k, v, shard.cache_seqlens, padded.to(shard.block_table.device))


def _worker(rank, world, init_file, out_dir, specs, device_type):
    """One rank: run every case over one process group, save {case id: (out, lse)} for the parent."""
    if device_type == "cpu":
        # Triton backends on CPU tensors need the interpreter, set before triton is first imported
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        torch.cuda.set_device(rank)
    backend = "gloo" if device_type == "cpu" else "nccl"
    dist.init_process_group(
        backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )  # fmt: skip
    results = {}
    try:
        for spec in specs:
            name, *_, local_backend, merge, _layout, _weights = spec
            c, shard = build(spec, world, rank, device=device_type)
            results[name] = tuple(
                t.cpu()
                for t in decode_attention_cp(c.q, *shard.args, backend=local_backend, merge=merge, return_lse=True)
            )
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()


def run_world(world, specs, tmp_path, device_type="cpu"):
    """Spawn ``world`` ranks over ``specs``; return each rank's {case id: (out, lse)}."""
    # a spawned rank imports this module (and triton) before _worker runs: the interpreter switch goes through
    # the environment it inherits (also on a GPU machine, where these CPU-tensor cases still need it)
    saved = os.environ.get("TRITON_INTERPRET")
    if device_type == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        mp.spawn(_worker, args=(world, str(tmp_path / "rendezvous"), str(tmp_path), specs, device_type), nprocs=world)
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def check_against_single_process(spec, world, per_rank, device):
    """Every rank holds the same result, matching the single-process run and the float64 reference."""
    name, *_, local_backend, _merge, _layout, _weights = spec
    c, _ = build(spec, world, 0, device=device)
    out, lse = per_rank[0][name]
    for r in range(1, world):
        assert torch.equal(per_rank[r][name][0], out) and torch.equal(per_rank[r][name][1], lse), f"{name}: rank {r}"
    single_out, single_lse = decode_attention(*c.args, backend=local_backend, return_lse=True)
    assert out.shape == c.q.shape and out.dtype == c.q.dtype and lse.dtype == torch.float32

    q3 = c.q[:, 0] if c.q.dim() == 4 else c.q
    c3 = type(c)(q3, *c.args[1:])
    ref_out, ref_lse = reference_of(c3)
    scale = float(ref_out.abs().max().clamp_min(1.0)) if ref_out.numel() else 1.0
    # beyond the single-process gate: each rank's partial is rounded to q's dtype before the fp32 merge (half an
    # ulp), and the merge adds a few fp32 roundings per rank
    extra = (torch.finfo(c.q.dtype).eps + world * torch.finfo(torch.float32).eps) * scale
    tolerance = output_tolerance(c3, ref_out, c.q.dtype) + extra
    out3 = out.reshape(q3.shape)
    # the LSE has q's shape without D ([B, 1, Hq] for a 4-D q)
    assert lse.shape == c.q.shape[:-1]
    lse, single_lse = lse.reshape(q3.shape[:-1]), single_lse.reshape(q3.shape[:-1])
    assert max_err(out3, ref_out) <= tolerance, f"{name}: error {max_err(out3, ref_out):.3g} > {tolerance:.3g}"
    # the same local math on fewer tokens per call: cp and single differ by at most the gate
    assert max_err(out, single_out) <= tolerance, f"{name}: cp - single {max_err(out, single_out):.3g}"
    finite = torch.isfinite(ref_lse)
    lse_scale = float(ref_lse[finite].abs().max()) if finite.any() else 0.0
    # the merge: a few fp32 roundings per rank at the LSE's scale
    lse_tol = lse_tolerance(c3, ref_lse) + world * 4 * torch.finfo(torch.float32).eps * (1.0 + lse_scale)
    assert lse_err(lse, ref_lse) <= lse_tol, f"{name}: LSE error {lse_err(lse, ref_lse):.3g} > {lse_tol:.3g}"
    assert lse_err(lse, single_lse) <= lse_tol, name
    # no token anywhere: exactly 0 and -inf
    empty = c.cache_seqlens.cpu() == 0
    assert torch.isneginf(lse[empty]).all() and (out3[empty] == 0).all(), name


@pytest.mark.parametrize("world", [2, 3], ids=lambda w: f"world{w}")
def test_cp_gloo_matches_single_process(world, tmp_path):
    # the Triton cases (and the Triton merge) run on CPU tensors through the interpreter (CI); on a GPU machine the
    # NCCL test runs them natively (the interpreter there may meet a numpy it does not support)
    specs = [s for s in CASES if interpreting() or s[7] != "triton"]
    specs += TRITON_CASES if world == 2 and interpreting() else []
    per_rank = run_world(world, specs, tmp_path)
    for spec in specs:
        check_against_single_process(spec, world, per_rank, "cpu")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL)")
def test_cp_nccl_matches_single_process(tmp_path):
    # the local kernel and the merge that "auto" picks on CUDA tensors (Triton)
    specs = [spec[:6] + ("auto", "auto") + spec[8:] for spec in CASES]
    per_rank = run_world(2, specs, tmp_path, device_type="cuda")
    for spec in specs:
        check_against_single_process(spec, 2, per_rank, "cuda")


# ---------------------------------------------------------------------------------------------- one process


@pytest.mark.parametrize(
    "layout, world, weights",
    [("contiguous", w, None) for w in (1, 2, 3)] + [("round_robin", w, None) for w in (1, 2, 3)]
    + [("contiguous", 3, [1, 0, 2]), ("contiguous", 4, [5, 1, 1, 0])],
)  # fmt: skip
def test_shards_hold_every_token_once(layout, world, weights):
    """Contiguous shards concatenate to the sequence; round-robin shards interleave its pages."""
    page = 4
    c = case([0, 1, 4, 5, 23, 41], 2, 2, 8, page, torch.float32, "cpu", seed=3)
    shards = shard_paged_cache(*c.args[1:], world, layout=layout, weights=weights)
    assert len(shards) == world
    lens = torch.stack([s.cache_seqlens for s in shards])  # [world, B]
    assert torch.equal(lens.sum(0), c.cache_seqlens)
    for b, seqlen in enumerate(c.cache_seqlens.tolist()):
        whole = gather_sequence(c.k_cache, c.block_table[b], seqlen)
        parts = [gather_sequence(s.k_cache, s.block_table[b], int(s.cache_seqlens[b])) for s in shards]
        if layout == "contiguous":
            assert torch.equal(torch.cat(parts), whole)
        else:
            for i in range(-(-seqlen // page)):
                rank, local = i % world, i // world
                got = parts[rank][local * page : (local + 1) * page]
                assert torch.equal(got, whole[i * page : (i + 1) * page])
    if weights is not None:
        # a zero weight: no page at all
        assert all(s.k_cache.shape[0] == 0 for s, w in zip(shards, weights) if w == 0)


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_merge_gathered_matches_reference(world, device):
    """Both merges against a float64 fold of reference_merge_states, with empty ranks holding NaN outputs."""
    gen = torch.Generator().manual_seed(world)
    batch, heads, d = 3, 5, 24
    gathered = torch.randn(world, batch, heads, d + 1, generator=gen)
    gathered[..., d] *= 8
    # rank 0 empty for sequence 0 (its output garbage); every rank empty for sequence 1, head 2
    gathered[0, 0, :, d] = -math.inf
    gathered[0, 0, :, :d] = float("nan")
    gathered[:, 1, 2, d] = -math.inf
    gathered[:, 1, 2, :d] = float("nan")
    ref_out = torch.zeros(batch, heads, d, dtype=torch.float64)
    ref_lse = torch.full((batch, heads), -math.inf, dtype=torch.float64)
    for r in range(world):
        ref_out, ref_lse = reference_merge_states(ref_out, ref_lse, gathered[r, ..., :d], gathered[r, ..., d])
    for merge in ("torch", "triton"):
        for dtype in (torch.float32, torch.bfloat16):
            out, lse = merge_gathered(gathered.to(device), dtype, merge=merge)
            assert out.dtype == dtype and out.shape == (batch, heads, d) and lse.shape == (batch, heads)
            bound = torch.finfo(dtype).eps * float(ref_out.abs().max()) + world * 4e-7
            assert max_err(out, ref_out) <= bound, (merge, dtype, max_err(out, ref_out))
            assert lse_err(lse, ref_lse) <= world * 4 * torch.finfo(torch.float32).eps * 32, (merge, dtype)
            assert (out[1, 2] == 0).all() and torch.isneginf(lse[1, 2])


@pytest.mark.parametrize("backend", ["reference", "torch_naive", "torch_sdpa", "triton", "triton_splitk"])
def test_empty_pool(backend, device):
    """A rank may hold no page at all: every backend gives 0 and -inf from a pool of 0 pages."""
    q = torch.randn(2, 4, 16, device=device)
    k = torch.empty(0, 8, 2, 16, device=device)
    table = torch.full((2, 3), -1, dtype=torch.int32, device=device)
    lens = torch.zeros(2, dtype=torch.int32, device=device)
    out, lse = decode_attention(q, k, k, lens, table, backend=backend, return_lse=True)
    assert torch.equal(out, torch.zeros_like(q)) and torch.isneginf(lse).all()


@pytest.fixture
def world_of_one(tmp_path):
    """A gloo process group of this process alone."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


ON_CPU_TRITON = pytest.mark.skipif(not interpreting(), reason="Triton on CPU tensors needs the interpreter (CI)")


@pytest.mark.parametrize("merge", ["torch", pytest.param("triton", marks=ON_CPU_TRITON)])
def test_cp_world_of_one_is_decode_attention(world_of_one, merge):
    """One rank: the merge hands the local output through exactly (bf16 -> fp32 -> bf16 is lossless); the Triton
    merge's LSE goes through base 2 and back (a few fp32 ulps)."""
    c = case([0, 9, 30], 6, 3, 16, 8, torch.bfloat16, "cpu", seed=5)
    out, lse = decode_attention_cp(*c.args, backend="torch_sdpa", merge=merge, return_lse=True)
    single_out, single_lse = decode_attention(*c.args, backend="torch_sdpa", return_lse=True)
    assert torch.equal(out, single_out)
    if merge == "torch":
        assert torch.equal(lse, single_lse)
    else:
        assert lse_err(lse, single_lse) <= 4 * torch.finfo(torch.float32).eps * float(single_lse[1:].abs().max())


def test_cp_validation(world_of_one, monkeypatch):
    c = case([8], 2, 2, 8, 4, torch.float32, "cpu")
    with pytest.raises(ValueError, match="merge must be one of"):
        decode_attention_cp(*c.args, merge="nccl")
    with pytest.raises(TypeError, match="block_table must be int32, got torch.int64"):
        decode_attention_cp(*c.args[:4], c.block_table.long())
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="merge 'triton' needs CUDA tensors"):
        decode_attention_cp(*c.args, merge="triton")


def test_cp_needs_an_initialized_process_group():
    c = case([8], 2, 2, 8, 4, torch.float32, "cpu")
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        decode_attention_cp(*c.args)


def test_shard_validation():
    c = case([8], 2, 2, 8, 4, torch.float32, "cpu")
    with pytest.raises(ValueError, match="world_size must be an int >= 1, got 0"):
        shard_paged_cache(*c.args[1:], 0)
    with pytest.raises(ValueError, match="layout must be one of"):
        shard_paged_cache(*c.args[1:], 2, layout="striped")
    for weights in ([1, -1], [1, float("nan")], [1, float("inf")]):
        with pytest.raises(ValueError, match="weights must be 2 finite non-negative numbers"):
            shard_paged_cache(*c.args[1:], 2, weights=weights)
    with pytest.raises(ValueError, match="weights apply to layout 'contiguous' only"):
        shard_paged_cache(*c.args[1:], 2, layout="round_robin", weights=[1, 1])
    with pytest.raises(TypeError, match="block_table must be int32, got torch.int64"):
        shard_paged_cache(*c.args[1:4], c.block_table.long(), 2)
    k, v, lens, table = c.args[1:5]
    with pytest.raises(ValueError, match=r"k_cache must be 4-D, got shape \(4, 2, 8\)"):
        shard_paged_cache(k[0], v[0], lens, table, 2)
    with pytest.raises(ValueError, match=r"block_table must have a row per sequence \(2\), got \(1, "):
        shard_paged_cache(k, v, lens.repeat(2), table, 2)
    # the values, as decode_attention checks them: each was copied or dropped silently (a -1 page as the pool's
    # last page, a negative length as 0), or failed deep inside with an IndexError
    bad_page = table.clone()
    bad_page[0, 1] = -1
    for lens_, table_, match in (
        (lens, bad_page, r"block_table\[0, 1\] = -1 is not a page id"),
        (lens * 0 - 3, table, r"cache_seqlens\[0\] must be >= 0, got -3"),
        (lens + table.shape[1] * 4, table, r"cache_seqlens\[0\] = \d+ needs \d+ pages"),
    ):
        with pytest.raises(ValueError, match=match):
            shard_paged_cache(k, v, lens_, table_, 2)


def test_docstring_example():
    result = doctest.testmod(flashdecode.distributed, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
