"""Split-K: partials against the PyTorch mirror, split-count invariance, empty splits, the combine math."""

import math

import pytest
import torch
from helpers import (
    case,
    check_planned_partials,
    lse_err,
    lse_tolerance,
    max_err,
    output_tolerance,
    planned_saturation,
    ragged_lengths,
    reference_of,
)

from flashdecode import decode_attention
from flashdecode.triton_splitk import (
    chunk_plan,
    decode_splitk,
    split_bounds,
    splitk_partials_mirror,
    grid_chunks,
    narrow_cut,
    num_candidates,
)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 8, 40], ids=lambda s: f"S{s}")
def test_split_count_invariance(num_splits, device):
    """Any split count gives the reference answer, including more splits than pages (empty splits)."""
    page = 16
    c = case(ragged_lengths(page), 8, 2, 128, page, torch.bfloat16, device, seed=11)
    ref_out, ref_lse = reference_of(c)
    out, lse = decode_attention(
        *c.args, backend="triton_splitk", num_splits=num_splits, return_lse=True, out=torch.full_like(c.q, float("nan"))
    )
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)
    assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)


def test_partials_match_mirror_fixed_splits(device):
    """Fixed mode: every split's (o_s, lse_s) equals the float64 mirror's, empty splits (0, -inf) included."""
    c = case([0, 5, 40, 100], 12, 4, 64, 12, torch.float32, device, seed=12)
    num_splits, block_n = 4, 16
    out = torch.empty_like(c.q)
    lse = torch.empty(c.q.shape[:2], device=device)
    _, _, o_part, lse_part = decode_splitk(
        *c.args, 0.125, out, lse, num_splits=num_splits, config={"BLOCK_N": block_n}, return_partials=True
    )
    chunks = [(b, *bounds) for b, n in enumerate([0, 5, 40, 100]) for bounds in split_bounds(n, num_splits, block_n)]
    ref_o, ref_lse = splitk_partials_mirror(*c.args, 0.125, chunks)
    assert torch.isneginf(ref_lse).any(), "the case must contain empty splits"
    assert lse_err(lse_part, ref_lse) <= 1e-5
    assert max_err(o_part[..., :64], ref_o) <= 1e-5


@pytest.mark.parametrize("narrow", [True, False], ids=["int32-cut", "int64-cut"])
@pytest.mark.parametrize(
    "num_sms,inline_max,inline_fused,fused_max,launches",
    [(8, 16, 16, 64, "zero"), (8, 16, 16, 2, "combine zero"), (8, 16, 0, 64, "plan"), (8, 16, 0, 2, "plan combine"),
     (64, 16, 16, 64, "combine"), (64, 0, 16, 64, "plan combine")],
    ids=["fused-in-place", "fused-in-place-long", "fused-planner", "fused-planner-long", "in-place", "planner"],
)
def test_partials_match_mirror_planned(
    num_sms, inline_max, inline_fused, fused_max, launches, narrow, device, monkeypatch
):  # fmt: skip
    """Planned mode: a long sequence among short ones gets many chunks; each chunk's partial matches the mirror,
    single-chunk sequences go straight to the output. The ways to run the cut: B * Hq >= #SMs merges in the partial
    kernel (no combine launch), the partial programs planning in place after a kernel that zeroes the merge counters
    (INLINE_FUSED_MAX_BATCH) or reading the planner kernel's cut, the sequences of more than FUSED_MAX_CHUNKS chunks
    (set to 2: the long one) left to a combine of one program a row per such sequence (``COMBINE_LONG_ONLY``, which
    finds it in the planner's counts or its own in-place cut); fewer pairs with a small batch plan in place
    (``inline_chunk``) and launch the combine; or the planner kernel and the combine (INLINE_PLAN_MAX_BATCH = 0).
    Each counts in int32 (``narrow_cut``, these shapes) or int64 (NARROW_CUT off), to the same cut."""
    from flashdecode import triton_splitk

    monkeypatch.setattr(triton_splitk, "INLINE_PLAN_MAX_BATCH", inline_max)
    monkeypatch.setattr(triton_splitk, "INLINE_FUSED_MAX_BATCH", inline_fused)
    monkeypatch.setattr(triton_splitk, "FUSED_MAX_CHUNKS", fused_max)
    monkeypatch.setattr(triton_splitk, "NARROW_CUT", narrow)
    # workspaces poisoned: merge counters nobody zeroes would not start at 0
    real_workspace = triton_splitk.workspace
    monkeypatch.setattr(triton_splitk, "workspace", lambda *a: real_workspace(*a).fill_(
        float("nan") if a[1].is_floating_point else 12345))
    launched = {"plan": 0, "combine": 0, "zero_counters": 0}
    for name in launched:
        real = getattr(triton_splitk, f"launch_{name}")
        monkeypatch.setattr(triton_splitk, f"launch_{name}",
                            lambda *a, _real=real, _name=name, **k: launched.__setitem__(_name, 1) or _real(*a, **k))
    lens = [3, 700, 20, 0, 64]
    c = case(lens, 8, 2, 64, 16, torch.float32, device, seed=13)
    out = torch.full_like(c.q, float("nan"))
    lse = torch.empty(c.q.shape[:2], device=device)
    block_n = 32
    _, _, o_part, lse_part = decode_splitk(
        *c.args, 0.125, out, lse, num_sms=num_sms, config={"BLOCK_N": block_n}, return_partials=True
    )
    max_tokens = c.block_table.shape[1] * 16
    num_cand = num_candidates(max_tokens, block_n)
    chunks = chunk_plan(lens, 2, num_sms, grid_chunks(len(lens), 2, num_sms), block_n, num_cand,
                        saturation=planned_saturation(c))  # fmt: skip
    check_planned_partials(c, chunks, out, lse, o_part, lse_part, 0.125, 64)
    assert [name for name, n in launched.items() if n] == launches.replace("zero", "zero_counters").split()


@pytest.mark.parametrize("inline_max", [16, 0], ids=["inline", "planner"])
def test_mha_tile_target_reaches_the_cut(inline_max, device, monkeypatch):
    """The planner's target by tile (``PLANNER_SATURATION``) is the one the kernels cut with: MHA with 3 KV heads of
    768-byte rows (the "mha" tile, 3 programs per SM) cuts the mirror's 15 chunks with a target of 3, not the 27 of
    the default 4 (on 24 SMs), whether the partial programs plan in place or read the planner kernel's cut."""
    from flashdecode import triton_splitk

    monkeypatch.setattr(triton_splitk, "INLINE_PLAN_MAX_BATCH", inline_max)
    lens = [3, 700, 20, 0, 64]
    c = case(lens, 3, 3, 64, 16, torch.float32, device, seed=17)
    out = torch.full_like(c.q, float("nan"))
    lse = torch.empty(c.q.shape[:2], device=device)
    num_sms, block_n = 24, 16
    _, _, o_part, lse_part = decode_splitk(
        *c.args, 0.125, out, lse, num_sms=num_sms, config={"BLOCK_N": block_n}, return_partials=True
    )
    assert planned_saturation(c) == triton_splitk.PLANNER_SATURATION["mha"] == 3
    grid = grid_chunks(len(lens), 3, num_sms), block_n, num_candidates(c.block_table.shape[1] * 16, block_n)
    chunks = chunk_plan(lens, 3, num_sms, *grid, saturation=3)
    assert len(chunks) != len(chunk_plan(lens, 3, num_sms, *grid, saturation=4)), "the case must tell 3 from 4"
    check_planned_partials(c, chunks, out, lse, o_part, lse_part, 0.125, 64)


def test_in_place_mha_slots_return_only_past_the_most_chunks(device, monkeypatch):
    """In-place plans of (chunk slots, heads) grids return from a slot past ``most_chunks`` (one chunk per BLOCK_N
    tile) before the cut (INLINE_EXIT). On 64 SMs these short sequences are cut at the smallest candidate, so the
    cut's chunk count is exactly that bound: a bound any lower would leave chunks unwritten."""
    from flashdecode import triton_splitk

    assert triton_splitk.INLINE_EXIT
    lens = [3, 40, 20, 0, 64, 17]
    c = case(lens, 3, 3, 64, 16, torch.float32, device, seed=19)
    out = torch.full_like(c.q, float("nan"))
    lse = torch.empty(c.q.shape[:2], device=device)
    num_sms, block_n = 64, 16
    _, _, o_part, lse_part = decode_splitk(
        *c.args, 0.125, out, lse, num_sms=num_sms, config={"BLOCK_N": block_n}, return_partials=True
    )
    grid = grid_chunks(len(lens), 3, num_sms), block_n, num_candidates(c.block_table.shape[1] * 16, block_n)
    chunks = chunk_plan(lens, 3, num_sms, *grid, saturation=planned_saturation(c))
    assert len(chunks) == sum(max(-(-n // block_n), 1) for n in lens), "the cut must reach the bound"
    check_planned_partials(c, chunks, out, lse, o_part, lse_part, 0.125, 64)


def test_in_place_combine_small_and_wide_blocks(device, monkeypatch):
    """After an in-place plan with many (sequence, row) pairs the combine merges a sequence of at most
    COMBINE_INLINE_SMALL_S chunks in one small block and a longer one in COMBINE_BLOCK_S blocks (set to 2 and 4 here,
    so that the long sequence takes several wide blocks): both against the reference, NaN-poisoned, LSE included."""
    from flashdecode import triton_splitk

    # no fused merge: a small batch plans in place
    monkeypatch.setattr(triton_splitk, "FUSED_COMBINE", False)
    monkeypatch.setattr(triton_splitk, "COMBINE_INLINE_SMALL_S", 2)
    monkeypatch.setattr(triton_splitk, "COMBINE_BLOCK_S", 4)
    lens = [900, 40, 130, 0]
    c = case(lens, 8, 2, 64, 16, torch.float32, device, seed=23)
    num_sms, block_n = 8, 16
    assert triton_splitk.plans_in_place(len(lens), 1, 8, 2, num_sms) and len(lens) * 8 >= num_sms
    grid = grid_chunks(len(lens), 2, num_sms), block_n, num_candidates(c.block_table.shape[1] * 16, block_n)
    counts = [sum(1 for b, _, _ in chunk_plan(lens, 2, num_sms, *grid, saturation=planned_saturation(c)) if b == s)
              for s in range(len(lens))]  # fmt: skip
    assert max(counts) > 4 and 1 < min(n for n in counts if n > 1) <= 2, counts
    out = torch.full_like(c.q, float("nan"))
    lse = torch.full(c.q.shape[:2], float("nan"), device=device)
    decode_splitk(*c.args, 0.125, out, lse, num_sms=num_sms, config={"BLOCK_N": block_n})
    ref_out, ref_lse = reference_of(c, softmax_scale=0.125)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float32)
    assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)


def test_chunk_plan_covers_every_token_within_the_grid():
    for lens in ([0], [5], [131072] + [1024] * 63, [1] * 300, [7, 0, 4096, 33], [4096] * 64):
        for hkv, sms in ((1, 8), (8, 132), (2, 132)):
            slots = grid_chunks(len(lens), hkv, sms)
            plan = chunk_plan(lens, hkv, sms, slots, 64, num_candidates(max(lens), 64))
            assert len(plan) <= slots
            for b, n in enumerate(lens):
                covered = [t for s, start, end in plan if s == b for t in range(start, end)]
                assert covered == list(range(n))
            assert all(start % 64 == 0 and (end > start or lens[b] == 0) for b, start, end in plan)
            # every sequence has a chunk, an empty one exactly one empty chunk (its program writes out = 0)
            assert sorted({b for b, _, _ in plan}) == list(range(len(lens)))
            assert all((b, 0, 0) in plan and sum(1 for s, _, _ in plan if s == b) == 1 for b, n in enumerate(lens) if n == 0)


def test_planner_choices():
    """The cost model splits a lone long sequence, keeps a full uniform batch whole, splits the long member of a
    ragged batch while the short ones stay whole, and does not cut short sequences into short chunks."""

    def per_seq(lens, hkv):
        plan = chunk_plan(lens, hkv, 132, grid_chunks(len(lens), hkv, 132), 64, num_candidates(max(lens), 64))
        return [sum(1 for b, _, _ in plan if b == s) for s in range(len(lens))]

    assert per_seq([65536], 12)[0] >= 32
    assert per_seq([4096] * 64, 8) == [1] * 64
    ragged = per_seq([131072] + [1024] * 63, 8)
    assert ragged[0] >= 64 and set(ragged[1:]) == {1}
    # the mean chunk term: 1024-token chunks would give 1528 programs of 1024 tokens (12 per SM), 2048-token ones
    # 512 of 2048 and 504 of 1024 (the same bytes, fewer programs); costing every chunk at the longest picked 1024
    assert ragged[0] == 64
    # a chunk's fixed cost (CHUNK_OVERHEAD_TOKENS = 64): short sequences are not cut below 256 tokens here; at 32 the
    # model cut 112 x 512 into four 128-token chunks each (H200: 28.1 us against 24.2 for two)
    assert per_seq([512] * 112, 2) == [2] * 112


def test_split_bounds_cover_sequence_on_tile_edges():
    for seqlen in [0, 1, 15, 16, 17, 100, 1000]:
        for splits in [1, 2, 3, 7, 33, 64]:
            bounds = split_bounds(seqlen, splits, 16)
            assert len(bounds) == splits
            covered = [t for start, end in bounds for t in range(start, end)]
            assert covered == list(range(seqlen))
            assert all(start % 16 == 0 for start, end in bounds if end > start)
            # any S balances: split sizes in tiles differ by at most one (S = 3 of 63 tiles: 21 each, not 22, 22, 19)
            tiles = [-(-end // 16) - start // 16 for start, end in bounds]
            assert max(tiles) - min(tiles) <= 1, (seqlen, splits, tiles)


def test_grid_chunks_sized_from_batch_and_sms():
    assert grid_chunks(batch=4, num_kv_heads=8, num_sms=132) == 4 + 132
    assert grid_chunks(batch=1, num_kv_heads=2, num_sms=132) == 1 + 528
    assert num_candidates(131072, 64) == 16 and num_candidates(64, 64) == 2


def test_narrow_cut_bound(monkeypatch):
    """The cut counts in int32 while B * table tokens * Hkv (a bound on its tokens, chunks and programs) < 2^31."""
    from flashdecode import triton_splitk

    assert narrow_cut(512, 131072, 8) and narrow_cut(16, 2**20, 64)
    assert not narrow_cut(512, 2**20, 4) and not narrow_cut(1, 2**31, 1)
    monkeypatch.setattr(triton_splitk, "NARROW_CUT", False)
    assert not narrow_cut(1, 512, 1)


def test_auto_rule(device, monkeypatch):
    """auto plans split-K for long sequences, and runs single-pass when no sequence can exceed 256 tokens or when
    B * Hkv alone gives every SM SATURATION_PER_SM programs."""
    import flashdecode.api as api
    from flashdecode.triton_splitk import SATURATION_PER_SM

    calls = []
    monkeypatch.setattr(api, "_num_sms", lambda dev: 2)
    # the planned path, not the small-table rule (test_auto_small_table_takes_capacity_splits)
    monkeypatch.setattr(api, "CAPACITY_SPLITS_MAX_TOKENS", 0)
    for name in ("triton", "triton_splitk"):
        real = api._BACKEND_FNS[name]
        monkeypatch.setitem(api._BACKEND_FNS, name, lambda *a, _n=name, _r=real: (calls.append((_n, a[-1])), _r(*a)))
    long_one = case([300], 4, 1, 64, 16, torch.float16, device)
    short = case([20] * 3, 4, 1, 64, 16, torch.float16, device)
    full = case([300] * (2 * SATURATION_PER_SM), 4, 1, 64, 16, torch.float16, device)
    for c in (long_one, short, full):
        decode_attention(*c.args)
    assert calls == [("triton_splitk", None), ("triton", 1), ("triton", 1)]


def test_auto_single_pass_threshold_is_the_tiles_planner_target(monkeypatch):
    """auto runs the single pass once B * Hkv reaches the planner's target for the call's tile times the SMs: 2 per SM
    for head dim 256 ("deep": one 128 KB tile per SM), 4 for the grouped head-dim-128 tile."""
    import flashdecode.api as api
    from flashdecode import triton_common
    from flashdecode.triton_splitk import PLANNER_SATURATION, planner_target

    monkeypatch.setattr(api, "_num_sms", lambda dev: 4)
    monkeypatch.setattr(triton_common, "interpreting", lambda: True)
    monkeypatch.setattr(api, "CAPACITY_SPLITS_MAX_TOKENS", 0)
    assert planner_target(256, 4, torch.bfloat16, 1, 2, 2) == PLANNER_SATURATION["deep"] == 2
    assert planner_target(128, 4, torch.bfloat16, 1, 2, 2) == PLANNER_SATURATION["grouped"] == 4

    def choice(batch, head_dim):
        q = torch.empty(batch, 8, head_dim, device="meta", dtype=torch.bfloat16)
        k = torch.empty(100, 16, 2, head_dim, device="meta", dtype=torch.bfloat16)
        return api._choose_backend("auto", None, q, k, torch.empty(batch, 50, device="meta", dtype=torch.int32))[0]

    assert [choice(b, 256) for b in (3, 4)] == ["triton_splitk", "triton"]
    assert [choice(b, 128) for b in (4, 7, 8)] == ["triton_splitk", "triton_splitk", "triton"]


def test_auto_small_table_takes_capacity_splits(device, monkeypatch):
    """A small batch in a table of at most CAPACITY_SPLITS_MAX_TOKENS: auto runs the fixed splits that plan_decode
    gives full-table lengths (shapes only: meta tensors); a wider table, a bigger batch, a batch whose planned path
    fuses the merge or the rule off plan on the device. Through decode_attention, ragged lengths (an empty and a
    one-token sequence among them) in such a table match the reference (NaN-poisoned out and lse)."""
    import flashdecode.api as api
    from flashdecode import plan as plan_module
    from flashdecode import plan_decode, triton_common
    from flashdecode.triton_splitk import INLINE_PLAN_MAX_BATCH, capacity_splits

    monkeypatch.setattr(api, "_num_sms", lambda dev: 132)
    monkeypatch.setattr(triton_common, "interpreting", lambda: True)
    limit = api.CAPACITY_SPLITS_MAX_TOKENS
    assert limit >= 2048

    def choice(batch, pages):
        q = torch.empty(batch, 28, 128, device="meta", dtype=torch.bfloat16)
        k = torch.empty(100, 16, 4, 128, device="meta", dtype=torch.bfloat16)
        return api._choose_backend("auto", None, q, k, torch.empty(batch, pages, device="meta", dtype=torch.int32))

    # 8 x 2048 tokens, 28/4: the plan's 16 splits of full lengths (H200: 16.6 -> 15.1 us)
    assert choice(8, 128) == ("triton_splitk", 16) == ("triton_splitk", capacity_splits(8, 2048, 128, 7,
                                                                                    torch.bfloat16, 1, 2, 4, 132))
    full = case([2048] * 8, 28, 4, 128, 16, torch.bfloat16, "cpu", seed=3)
    # ...which plan_decode takes without GROUPED_LONG_TILE's 4 splits of one program per SM (merged with its counters)
    # or GROUPED_MID_TILE's halved splits
    assert plan_decode(full.q, full.k_cache, full.cache_seqlens, full.block_table).num_splits == 4
    monkeypatch.setattr(plan_module, "GROUPED_LONG_MIN_TOKENS", None)
    monkeypatch.setattr(plan_module, "GROUPED_MID_MIN_FILL", None)
    assert plan_decode(full.q, full.k_cache, full.cache_seqlens, full.block_table).num_splits == 16
    monkeypatch.undo()
    monkeypatch.setattr(api, "_num_sms", lambda dev: 132)
    monkeypatch.setattr(triton_common, "interpreting", lambda: True)
    assert choice(8, limit // 16 + 1) == ("triton_splitk", None)
    assert choice(INLINE_PLAN_MAX_BATCH + 1, 128) == ("triton_splitk", None)
    # 16 x 2048 at 32/8: the planned path merges in the last chunk program (merge_in_partial), kept
    q32 = torch.empty(16, 32, 128, device="meta", dtype=torch.bfloat16)
    k8 = torch.empty(100, 16, 8, 128, device="meta", dtype=torch.bfloat16)
    table16 = torch.empty(16, 128, device="meta", dtype=torch.int32)
    assert api._choose_backend("auto", None, q32, k8, table16) == ("triton_splitk", None)
    monkeypatch.setattr(api, "CAPACITY_SPLITS_MAX_TOKENS", 0)
    assert choice(8, 128) == ("triton_splitk", None)
    monkeypatch.setattr(api, "CAPACITY_SPLITS_MAX_TOKENS", limit)

    # fewer SMs so that the interpreter's case is small: 4 sequences, 2/1 heads (fewer (sequence, head) pairs than
    # SMs: planned in place), a 320-token table (above SINGLE_PASS_MAX_TOKENS)
    monkeypatch.setattr(api, "_num_sms", lambda dev: 16)
    c = case([150, 0, 1, 37], 2, 1, 64, 16, torch.bfloat16, device, seed=5, extra_table_columns=10)
    assert c.block_table.shape[1] * 16 == 320
    name, splits = api._choose_backend("auto", None, c.q, c.k_cache, c.block_table)
    assert name == "triton_splitk" and splits > 1, (name, splits)
    nan = torch.full_like(c.q, float("nan"))
    out, lse = decode_attention(*c.args, return_lse=True, out=nan)
    ref_out, ref_lse = reference_of(c)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)
    assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)


def test_auto_planner_reads_no_values():
    """The split choice uses shapes only: it runs on meta tensors, which have no values to read."""
    from flashdecode.api import _choose_backend

    q = torch.empty(2, 8, 128, device="meta", dtype=torch.bfloat16)
    k = torch.empty(100, 16, 2, 128, device="meta", dtype=torch.bfloat16)
    table = torch.empty(2, 50, device="meta", dtype=torch.int32)
    name, splits = _choose_backend("auto", None, q, k, table)
    assert name in ("triton", "triton_splitk", "torch_sdpa")


def _published_combine(acc_unnormalised, m, l_s):
    """The seed blog post's combine: partials stored as acc_s (unnormalised), weighted by l_s * exp(m_s - M)."""
    big_m = m.max()
    w = l_s * torch.exp(m - big_m)
    return (w[:, None] * acc_unnormalised).sum(0) / w.sum()


def _correct_combine(o_norm, lse):
    w = torch.exp(lse - lse.max())
    return (w[:, None] * o_norm).sum(0) / w.sum()


def test_published_combine_is_wrong_and_ours_is_right():
    """Derivation check in float64: exact softmax over 3 splits vs the two combines."""
    gen = torch.Generator().manual_seed(0)
    s = torch.randn(48, generator=gen, dtype=torch.float64) * 3
    v = torch.randn(48, 8, generator=gen, dtype=torch.float64)
    exact = torch.softmax(s, 0) @ v
    acc, m, l_s, o, lse = [], [], [], [], []
    for chunk in range(3):
        sc, vc = s[16 * chunk : 16 * chunk + 16], v[16 * chunk : 16 * chunk + 16]
        m_s = sc.max()
        p = torch.exp(sc - m_s)
        acc.append(p @ vc), m.append(m_s), l_s.append(p.sum())
        o.append(acc[-1] / l_s[-1]), lse.append(m_s + torch.log(l_s[-1]))
    acc, m, l_s, o, lse = map(torch.stack, (acc, m, l_s, o, lse))
    ours = _correct_combine(o, lse)
    assert (ours - exact).abs().max() < 1e-12
    published = _published_combine(acc, m, l_s)
    rel = (published - exact).norm() / exact.norm()
    assert rel > 0.1, f"the published combine should be far off, got relative error {rel:.3g}"
    assert not math.isclose(float(rel), 0.0)


@pytest.mark.parametrize("block_s,d_blocks", [(64, 2), (256, 4), (16, 8)])
def test_combine_block_shapes(block_s, d_blocks, device, monkeypatch):
    """The combine with other chunk blocks and the head dim split over several programs: the same merge."""
    import flashdecode.triton_splitk as splitk

    c = case([300, 0, 77, 1000], 8, 2, 64, 16, torch.float32, device, seed=31)
    ref_out, ref_lse = reference_of(c)
    monkeypatch.setattr(splitk, "COMBINE_BLOCK_S", block_s)
    monkeypatch.setattr(splitk, "COMBINE_D_BLOCKS", d_blocks)
    for num_splits in (None, 3, 40):
        out, lse = decode_attention(*c.args, backend="triton_splitk", num_splits=num_splits, return_lse=True,
                                    out=torch.full_like(c.q, float("nan")))  # fmt: skip
        assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float32), num_splits
        assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse), num_splits


@pytest.mark.parametrize("num_sms,one_warp_max,warps", [(64, 4096, 1), (64, 0, 4), (4, 4096, 4)],
                         ids=["wide", "off", "narrow"])
def test_wide_combine_warps(num_sms, one_warp_max, warps, device, monkeypatch):
    """Fixed splits' combine: one warp for the wide shape (B * Hq < #SMs) when COMBINE_ONE_WARP_MAX allows, four
    otherwise; the same merge either way."""
    import flashdecode.triton_splitk as splitk

    c = case([300, 77], 8, 2, 128, 16, torch.bfloat16, device, seed=37)
    ref_out, ref_lse = reference_of(c)
    monkeypatch.setattr(splitk, "COMBINE_ONE_WARP_MAX", one_warp_max)
    seen = []

    def spy(kernel, grid, *args, **kwargs):
        if kernel is splitk._combine_kernel:
            seen.append(kwargs["num_warps"])
        return launch(kernel, grid, *args, **kwargs)

    launch = splitk.launch
    monkeypatch.setattr(splitk, "launch", spy)
    out, lse = torch.full_like(c.q, float("nan")), torch.empty(2, 8, device=device)
    decode_splitk(*c.args, 128**-0.5, out, lse, num_splits=8, num_sms=num_sms)
    assert seen == [warps]
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)
    assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)


def test_fixed_splits_padded_grid_is_bit_identical(device, monkeypatch):
    """The probe-only launch shapes of the fixed mode (scripts/perf_probe.py grid: chunk slots padded past B * S,
    heads-first order) leave every output bit unchanged: the padding programs return without writing."""
    import flashdecode.triton_splitk as splitk

    c = case([0, 5, 40, 100], 8, 2, 64, 16, torch.float16, device, seed=13)
    runs = []
    for slots, heads_first in ((0, False), (20, False), (20, True)):
        monkeypatch.setattr(splitk, "FIXED_GRID_SLOTS", slots)
        monkeypatch.setattr(splitk, "FIXED_HEADS_FIRST", heads_first)
        out, lse = torch.full_like(c.q, float("nan")), torch.full(c.q.shape[:2], float("nan"), device=device)
        decode_splitk(*c.args, 0.125, out, lse, num_splits=3, num_sms=4)
        runs.append((out, lse))
    ref_out, _ = reference_of(c)
    assert max_err(runs[0][0], ref_out) <= output_tolerance(c, ref_out, torch.float16)
    for out, lse in runs[1:]:
        assert torch.equal(out, runs[0][0]) and torch.equal(lse, runs[0][1])


def test_tuning_switches_keep_the_result(device, monkeypatch):
    """The launch switches measured on the GPU (wide combine, split tile for small groups) change how the work is
    cut, never the answer; with them off, the same answer."""
    import flashdecode.triton_splitk as splitk

    c = case([3, 700, 20, 0, 64], 2, 2, 64, 16, torch.float32, device, seed=41)
    ref_out, ref_lse = reference_of(c)
    for wide, tile in (((256, 4), dict(BLOCK_N=64, num_stages=3)), (None, None)):
        monkeypatch.setattr(splitk, "COMBINE_WIDE", wide)
        monkeypatch.setattr(splitk, "SMALL_GROUP_SPLIT_TILE", tile)
        out, lse = torch.full_like(c.q, float("nan")), torch.empty(c.q.shape[:2], device=device)
        decode_splitk(*c.args, 64**-0.5, out, lse, num_sms=4)
        assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float32)
        assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)


@pytest.mark.parametrize(
    "fused,fused_max,inline_max,launches",
    [(True, 64, 16, 0), (True, 3, 16, 1), (True, 2, 16, 1), (False, 64, 16, 1), (False, 64, 0, 1)],
    ids=["last-program-merges", "both-ways", "both-ways-two-long", "combine-launch-inline-plan",
         "combine-launch-planner"],
)
def test_planned_merge_fused_or_launched(fused, fused_max, inline_max, launches, device, monkeypatch):
    """A planned cut merged every way matches the float64 reference: by the last chunk program of each (sequence,
    head block) to finish (``merge_if_last``, when B * q_len * Hq >= #SMs, for sequences of at most
    FUSED_MAX_CHUNKS chunks), by the combine launch, or both in one call (at most 3 chunks fused: the 130-token
    sequence's 3 chunks merge in the partial kernel, the 300-token one's 5 in the combine; at most 2: both in the
    combine, whose programs find the long sequences in the plan, COMBINE_LONG_ONLY), with the cut from the
    planner kernel or, for a combine launch on this small batch, computed in place. Ragged lengths with an
    empty sequence, two query tokens, 80 rows per KV head (two head blocks), sinks and the LSE, NaN-filled outputs.
    The combine is launched exactly when the table could hold a sequence the fused merge leaves to it."""
    from feature_helpers import check
    from test_multitoken import multi_case

    from flashdecode import triton_splitk

    monkeypatch.setattr(triton_splitk, "FUSED_COMBINE", fused)
    # this batch expects many chunks per sequence: the rule would not fuse it by itself
    monkeypatch.setattr(triton_splitk, "FUSED_EXPECTED_CHUNKS", 10**6)
    monkeypatch.setattr(triton_splitk, "FUSED_MAX_CHUNKS", fused_max)
    monkeypatch.setattr(triton_splitk, "INLINE_PLAN_MAX_BATCH", inline_max)
    launched = []
    real = triton_splitk.launch_combine
    monkeypatch.setattr(triton_splitk, "launch_combine", lambda *a, **k: launched.append(1) or real(*a, **k))
    args = multi_case([300, 0, 37, 130], 2, 40, 1, 64, 16, torch.float32, device, seed=61)
    plan = chunk_plan([300, 0, 37, 130], 1, 16, grid_chunks(4, 1, 16), 64, num_candidates(args[4].shape[1] * 16, 64))
    assert [sum(1 for b, _, _ in plan if b == s) for s in range(4)] == [5, 1, 1, 3]
    sinks = torch.linspace(-1.0, 2.0, 40, device=device)
    out, lse = check(args, "triton_splitk", None, sinks=sinks)
    assert len(launched) == launches
    assert torch.equal(out[1].cpu(), torch.zeros_like(out[1].cpu()))
    assert torch.allclose(lse[1].cpu(), sinks.cpu().expand(2, -1))


@pytest.mark.parametrize(
    "batch,spread,narrow",
    [pytest.param(b, s, n, id=f"B{b}-{('even', 'uneven')[s]}-{('int64', 'int32')[n]}")
     for b, s, n in [(1, 1, 1), (9, 1, 1), (40, 1, 1), (300, 1, 1), (9, 0, 1), (40, 0, 1), (9, 1, 0), (300, 1, 0)]],
)  # fmt: skip
def test_planner_kernel_writes_the_mirrors_cut(batch, spread, narrow, device):
    """The planner kernel's cut equals ``chunk_plan``'s entry by entry, at batch sizes that use every planner shape
    (64 slots x 4 warps per program down to 4 slots x 1 warp), in ``dispatch_order``: (sequence, start, end, chunk
    id) per used grid slot, unused slots marked with sequence B, and each sequence's first chunk and chunk count. An
    uneven batch goes longest first (every full chunk, then the last ones, longest bucket first); an even one (lengths
    2000..2999) in chunk order. The cut's counts in int32 (``narrow_cut``) or int64, alike."""
    from flashdecode.triton_splitk import SATURATION_PER_SM, chunk_size, dispatch_order, launch_plan

    g = torch.Generator().manual_seed(batch)
    lens = torch.randint(0, 3000, (batch,), generator=g) if spread else torch.randint(2000, 3000, (batch,), generator=g)
    lens[0] = 0 if spread else lens[0]
    if spread:
        lens[batch // 2] = 2999  # uneven with a long last chunk for B 1 too
    hkv, sms, block_n = 2, 16, 64
    slots, num_cand = grid_chunks(batch, hkv, sms), num_candidates(3000, block_n)
    plan = launch_plan(
        lens.to(torch.int32).to(device), hkv, sms, slots, block_n, num_cand, SATURATION_PER_SM, narrow=bool(narrow)
    ).cpu()
    expect = chunk_plan(lens.tolist(), hkv, sms, slots, block_n, num_cand)
    order = dispatch_order(lens.tolist(), chunk_size(lens.tolist(), hkv, sms, slots, block_n, num_cand), block_n)
    assert sorted(order) == list(range(len(expect)))
    assert (order != list(range(len(expect)))) == (spread and batch > 1)
    assert [tuple(plan[:4, i].tolist()) for i in range(len(expect))] == [expect[i] + (i,) for i in order]
    assert (plan[0, len(expect) : slots] == batch).all()
    counts = [sum(1 for b, _, _ in expect if b == s) for s in range(batch)]
    firsts = [sum(counts[:s]) for s in range(batch)]
    assert plan[1, slots:].tolist() == counts and plan[0, slots:].tolist() == firsts


def test_merge_in_partial_rule_on_the_anchor_rows():
    """The shapes-only rule on an H200 (132 SMs): merge in the last partial program when the batch gives few chunks
    per sequence (probes 6e71525 and 505aa6e: 64 x 1024 12/2 33.0 -> 26.8 us, 16 x 1024 32/8 31.3 -> 26.6), a combine
    launch when few (sequence, row) pairs or many chunks each (16 x 4096 12/2 28.1 -> 26.9 that way)."""
    from flashdecode.triton_splitk import merge_in_partial

    def fused(b, hq, hkv):
        return merge_in_partial(b, 1, hq, hkv, 132)

    assert fused(256, 12, 2) and fused(64, 12, 2) and fused(16, 32, 8) and fused(64, 32, 8) and fused(16, 12, 12)
    assert not fused(16, 12, 2) and not fused(8, 28, 4) and not fused(12, 12, 2) and not fused(5, 28, 4)
    assert not fused(1, 12, 2) and not fused(4, 12, 12) and not fused(1, 32, 32)
