"""plan_decode: the kernels chosen from lengths read on the host, then passed to decode_attention(plan=...).

The plan must pick what the device would (the single pass for an even dual-path batch, fixed splits that cut a
uniform batch exactly as the planner does, the device's plan for an uneven one), dispatch exactly that, and stay
correct when the lengths change after planning.
"""

import dataclasses

import pytest
import torch
from helpers import case, lse_err, lse_tolerance, max_err, output_tolerance, reference_of

from flashdecode import DecodePlan, api, decode_attention, plan_decode, triton_splitk
from flashdecode import plan as plan_module
from flashdecode.triton_common import launch_config, uses_prefetch_tile
from flashdecode.triton_splitk import decode_splitk, fixed_split_count

# a small GPU (the interpreter's programs are slow): the grouped tile's planner target is 4 programs per SM, so
# B * Hkv < 8 is planned, 8..15 dual-path, >= 16 single pass
SMS = 4
# (lengths, expected (backend, num_splits is None, dual_path)); 8 query heads over 2 KV heads, head dim 64, page 16,
# 20 spare table columns (tables that can hold more than 256 tokens, so the shapes alone do not pick the single pass)
CASES = {
    "uniform-planned": ([200, 200], ("triton_splitk", False, False)),
    "even-planned": ([200, 150], ("triton_splitk", False, False)),
    "uneven-planned": ([400, 20], ("triton_splitk", True, False)),
    "dual-even": ([100, 120, 100, 90], ("triton", False, False)),
    "dual-uneven": ([300, 20, 20, 20], ("triton_splitk", True, False)),
    "full-grid": ([60] * 8, ("triton", False, False)),
}


def _case(lens, device, seed=3, extra_table_columns=20):
    return case(lens, 8, 2, 64, 16, torch.float32, device, seed=seed, extra_table_columns=extra_table_columns)


def _nan_out(c):
    return torch.full_like(c.q, float("nan"))


def _run_checked(x, plan, dtype=torch.float32):
    """(out, lse) of the call with the plan, NaN-filled first (a row left unwritten fails), each within the
    reference's tolerance."""
    out, lse = decode_attention(*x.args, plan=plan, out=_nan_out(x), return_lse=True)
    ref_out, ref_lse = reference_of(x)
    assert max_err(out, ref_out) <= output_tolerance(x, ref_out, dtype)
    assert lse_err(lse, ref_lse) <= lse_tolerance(x, ref_lse)
    return out, lse


def _run_checked_features(args, plan, **kw):
    """_run_checked for call arguments with features (fp8 scales, softcap, ...): the reference and both tolerances
    take them too."""
    from feature_helpers import lse_tolerance as feature_lse_tolerance

    from flashdecode.check import output_tolerance as feature_output_tolerance
    from flashdecode.reference import reference_dense

    out, lse = decode_attention(*args, plan=plan, out=torch.full_like(args[0], float("nan")), return_lse=True, **kw)
    ref_out, ref_lse = reference_dense(*args, **kw)
    assert max_err(out, ref_out) <= feature_output_tolerance(args, ref_out, **kw)
    assert lse_err(lse, ref_lse) <= feature_lse_tolerance(args, ref_lse, **kw)


def _partial_tiles(monkeypatch):
    """A list that gets (BLOCK_N, num_stages) of every split-K partial kernel launched from now on."""
    tiles, launch = [], triton_splitk.launch

    def noting(kernel, grid, *a, **kw):
        if kernel is triton_splitk._partial_kernel:
            tiles.append((kw["BLOCK_N"], kw["num_stages"]))
        return launch(kernel, grid, *a, **kw)

    monkeypatch.setattr(triton_splitk, "launch", noting)
    return tiles


@pytest.fixture
def small_gpu(monkeypatch):
    monkeypatch.setattr(api, "_num_sms", lambda dev: SMS)


def _forced(c, plan):
    """(out, lse) of the plan's path run without the plan: its backend and num_splits, and for fixed splits merged in
    the last split program or with a host table, decode_splitk with the table and counters of its own."""
    if plan.counters is None and plan.table is None:
        forced = dict(num_splits=None) if plan.num_splits is None else dict(num_splits=plan.num_splits)
        return decode_attention(*c.args, backend=plan.backend, out=_nan_out(c), return_lse=True, **forced)
    out, lse = _nan_out(c), torch.full(c.q.shape[:-1], float("nan"), device=c.q.device)
    counters = torch.zeros_like(plan.counters) if plan.counters is not None else None
    scale = c.q.shape[-1] ** -0.5
    return decode_splitk(
        *c.args, scale, out, lse, num_splits=plan.num_splits, num_sms=SMS, counters=counters,
        table=None if plan.table is None else plan.table.clone(),
    )  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_plan_picks_and_runs_that_path(name, device, small_gpu):
    """The plan's choice for each kind of batch, the call with the plan bit-identical to that path forced, and both
    within the reference's tolerance (NaN-filled out and lse, so a row left unwritten fails)."""
    lens, (backend, planned, dual) = CASES[name]
    c = _case(lens, device)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert (plan.backend, plan.num_splits is None, plan.dual_path) == (backend, planned, dual), plan.reason
    out, lse = _run_checked(c, plan)
    alone = _forced(c, plan)
    assert torch.equal(out, alone[0]) and torch.equal(lse, alone[1])


def test_plan_repr_says_the_choice_not_the_tensors(device, small_gpu):
    """A plan prints its backend, splits, flags, batch shape and reason; its tensors by their size only."""
    c = _case([150, 3], device)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert plan.table is not None and plan.counters is not None, plan.reason
    text = repr(plan)
    assert text.startswith(f"DecodePlan(backend='triton_splitk', num_splits=None, counters=<{plan.counters.numel()} "
                           f"int32>, table=<{plan.table.numel()} int32>, B=2, heads={c.q.shape[-2]}/"), text
    assert text.endswith(f"reason={plan.reason!r})") and "tensor(" not in text and "device" not in text, text


def test_fixed_splits_reproduce_the_planned_cut(device, small_gpu):
    """For a uniform batch the plan's fixed splits are the planner's chunks: same partials, bit for bit (both modes
    number the chunks b * k + s), and the same output."""
    c = _case([200, 200], device)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert plan.num_splits > 1
    scale = c.q.shape[-1] ** -0.5
    runs = []
    for splits in (None, plan.num_splits):
        out, lse = _nan_out(c), torch.full(c.q.shape[:-1], float("nan"), device=device)
        runs.append(decode_splitk(*c.args, scale, out, lse, num_splits=splits, num_sms=SMS, return_partials=True))
    (out_p, lse_p, o_p, l_p), (out_f, lse_f, o_f, l_f) = runs
    chunks = 2 * plan.num_splits
    assert torch.equal(o_p[:chunks], o_f[:chunks]) and torch.equal(l_p[:chunks], l_f[:chunks])
    assert max_err(out_p, out_f) <= 1e-6 and lse_err(lse_p, lse_f) <= 1e-6


def test_plan_stays_correct_when_lengths_change(device, small_gpu):
    """A plan made for uniform lengths, used on a ragged batch of the same shapes (a stale plan, or a CUDA graph
    replayed after the lengths moved): slower perhaps, never wrong."""
    c = _case([200, 200], device)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    ragged = _case([0, 330], device, seed=4, extra_table_columns=12)
    assert ragged.block_table.shape == c.block_table.shape
    _run_checked(ragged, plan)


def test_recorded_launches_follow_the_plan(device, small_gpu):
    """The cached launcher keys on the plan: two plans on the same tensors each run their own path."""
    c = _case([200, 200], device)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    # the same tensors, fixed splits again, but 2 of them merged by the combine launch
    other = dataclasses.replace(plan, num_splits=2, counters=None)
    for p in (plan, other, plan, other):
        out = decode_attention(*c.args, plan=p, out=_nan_out(c))
        assert torch.equal(out, _forced(c, p)[0])


def test_fixed_splits_merged_in_the_last_program(device, small_gpu):
    """Few fixed splits and many (sequence, row) pairs: the plan holds zeroed counters and the last split program of
    each sequence and head merges (no combine launch). The counters are back at zero after every call (recorded,
    replayed, stale lengths with an empty sequence), which the next call needs: a merger that left its counter set
    would leave NaN rows in the next call's output."""
    c = _case([200, 200], device)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert 1 < plan.num_splits <= 8 and plan.counters is not None and "merged" in plan.reason, plan.reason
    ragged = _case([0, 330], device, seed=4, extra_table_columns=12)
    for x in (c, c, c, ragged, c):
        out, lse = _run_checked(x, plan)
        assert int(plan.counters.abs().sum()) == 0
    combined = decode_attention(*c.args, plan=dataclasses.replace(plan, counters=None), return_lse=True)
    assert max_err(out, combined[0]) <= 1e-6 and lse_err(lse, combined[1]) <= 1e-6


def test_mha_fixed_splits_merge_in_the_last_program_with_few_pairs(device, monkeypatch):
    """FIXED_MERGE_MHA_ANY_PAIRS: fixed splits of the "mha" tile class (3/3 heads of dim 64: a 384-byte token row)
    merge in the last split program although 3 (sequence, row) pairs are fewer than the 8 SMs; those of the
    small-group tile (4/4 heads: 512 bytes, a power of two) keep the combine launch, as the "mha" class does with the
    knob off. Each plan's output within the reference's tolerance (NaN-filled out and lse), counters back at zero."""
    monkeypatch.setattr(api, "_num_sms", lambda dev: 8)
    mha = case([512], 3, 3, 64, 16, torch.bfloat16, device, seed=5, extra_table_columns=20)
    small_group = case([256], 4, 4, 64, 16, torch.bfloat16, device, seed=6, extra_table_columns=20)
    plans = [plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table) for c in (mha, small_group)]
    assert [(p.num_splits, p.counters is not None) for p in plans] == [(4, True), (4, False)], plans
    monkeypatch.setattr(triton_splitk, "FIXED_MERGE_MHA_ANY_PAIRS", False)
    off = plan_decode(mha.q, mha.k_cache, mha.cache_seqlens, mha.block_table)
    assert off.num_splits == 4 and off.counters is None, off.reason
    for c, p in ((mha, plans[0]), (small_group, plans[1]), (mha, off)):
        _run_checked(c, p, torch.bfloat16)
    assert int(plans[0].counters.abs().sum()) == 0


@pytest.mark.parametrize("splits", [2, 3, 8])
def test_fixed_splits_merged_in_the_last_program_match_the_combine(splits, device):
    """decode_splitk(counters=...) merges S fixed splits in the last split program: all at once up to
    MERGE_UNROLL_ALL splits (2, 3), in MERGE_UNROLL steps beyond it (8). Ragged lengths: an empty sequence, one
    shorter than S tiles (empty splits) and ones with a token in every split; within 1e-6 of the same splits merged
    by the combine launch, and the counters back at zero."""
    c = _case([0, 37, 700, 520], device, seed=5)
    scale = c.q.shape[-1] ** -0.5
    counters = torch.zeros(4 * 8, dtype=torch.int32, device=c.q.device)
    runs = []
    for ctr in (counters, None):
        out, lse = _nan_out(c), torch.full(c.q.shape[:-1], float("nan"), device=c.q.device)
        runs.append(decode_splitk(*c.args, scale, out, lse, num_splits=splits, num_sms=SMS, counters=ctr))
    assert int(counters.abs().sum()) == 0
    assert max_err(runs[0][0], runs[1][0]) <= 1e-6 and lse_err(runs[0][1], runs[1][1]) <= 1e-6
    ref_out, ref_lse = reference_of(c)
    assert max_err(runs[0][0], ref_out) <= output_tolerance(c, ref_out, torch.float32)
    assert lse_err(runs[0][1], ref_lse) <= lse_tolerance(c, ref_lse)


def test_fixed_split_count_lengthens_short_splits_of_the_prefetch_tile():
    """FIXED_MIN_SPLIT_TILES: the plan halves a cut of PREFETCH_TILE's 32-token tiles while its chunks are shorter
    than 4 tiles and every SM keeps a program; other tiles keep the cut."""
    prefetch = launch_config(128, 4, torch.bfloat16)
    assert uses_prefetch_tile(prefetch) and prefetch["BLOCK_N"] == 32
    # 64 chunks of 32 tokens, 16 programs a split: 32 chunks of 64, then 16 of 128 (4 tiles)
    assert fixed_split_count(64, 32, prefetch, 16, 132) == 16
    # 8 splits of 64 tokens would leave 132 SMs with 128 programs: the cut stays
    assert fixed_split_count(64, 32, prefetch, 4, 132) == 64
    assert fixed_split_count(16, 128, prefetch, 16, 132) == 16
    # 2 splits of 64 tokens, 4 programs a split, 4 SMs: one split (the single pass)
    assert fixed_split_count(2, 64, prefetch, 4, 4) == 1
    fp32 = launch_config(128, 4, torch.float32)
    assert not uses_prefetch_tile(fp32) and fixed_split_count(64, 32, fp32, 16, 132) == 64


@pytest.mark.parametrize("lens, splits", [([256, 256], 2), ([384], 3)])
def test_plan_lengthens_short_fixed_splits(lens, splits, device, small_gpu, monkeypatch):
    """A bf16 batch at head dim 128 (PREFETCH_TILE) whose cut gives 64-token chunks: the plan takes half the cut's
    splits (2 of 128 tokens, or 3 of a 384-token sequence), still merged in the last split program, and the output
    is within the reference's tolerance (NaN-filled out and lse)."""
    c = case(lens, 8, 2, 128, 16, torch.bfloat16, device, seed=6, extra_table_columns=20)
    # 4 programs on the 4 SMs would take the single pass (SINGLE_FULL_*, the next test): off here
    monkeypatch.setattr(plan_module, "SINGLE_FULL_MAX_TOKENS", 0)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    monkeypatch.setattr(triton_splitk, "FIXED_MIN_SPLIT_TILES", 0)
    cut = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert plan.num_splits == splits and cut.num_splits == 2 * splits, (plan.reason, cut.reason)
    assert plan.counters is not None
    _run_checked(c, plan, torch.bfloat16)


@pytest.mark.parametrize("lens", [[700, 650], [900, 40]], ids=["even", "uneven"])
def test_plan_gives_fp8_caches_the_long_tile(lens, device, small_gpu, monkeypatch):
    """An fp8 cache (head dim 128, 8/2 heads) whose cut with FP8_LONG_TILE gives chunks of at least
    FP8_LONG_MIN_TOKENS (0: any): the plan says long_tile, its calls launch the 128-token tile (fixed splits of
    an even batch, the device's plan for an uneven one), and the output is within the float64 reference's tolerance
    (NaN-filled out and lse). The same fixed splits without long_tile launch FP8_SPLIT_TILE's 64 tokens, and
    with the threshold off (None) the plan does not ask for the tile."""
    from flashdecode import launcher

    monkeypatch.setattr(launcher, "ENABLED", False)
    c = case(lens, 8, 2, 128, 16, torch.float32, device, seed=9, extra_table_columns=20)
    args = (c.q.to(torch.bfloat16), (c.k_cache / 0.05).to(torch.float8_e4m3fn),
            (c.v_cache / 0.3).to(torch.float8_e4m3fn), c.cache_seqlens, c.block_table)  # fmt: skip
    plan = plan_decode(*args[:2], *args[3:])
    assert plan.long_tile and plan.backend == "triton_splitk", plan.reason
    assert (plan.num_splits is None) == (lens[1] < 100) and ("long fp8 tile" in plan.reason or lens[1] < 100)
    tiles = _partial_tiles(monkeypatch)
    # the device-planned call (uneven) fuses its merge here, and a fused call takes the long tile anyway
    for p, block_n in ((plan, 128), (dataclasses.replace(plan, long_tile=False), 64 if plan.num_splits else 128)):
        _run_checked_features(args, p, k_scale=0.05, v_scale=0.3)
        assert tiles[-1][0] == block_n
    monkeypatch.setattr(plan_module, "FP8_LONG_MIN_TOKENS", None)
    assert not plan_decode(*args[:2], *args[3:]).long_tile


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("lens", [[512], [480, 400]], ids=["uniform", "even"])
def test_plan_gives_long_mha_rows_the_deep_tile(lens, head_dim, device, small_gpu, monkeypatch):
    """MHA heads whose token row is not a power of two (3/3 heads, bf16: the "mha" tile class), fixed splits whose
    chunks reach the long tile's threshold (lowered here to 128 tokens) on a grid that fills the SMs' 3 slots: the
    plan says long_tile, its calls launch the class's long tile (head dim 64: MHA_LONG_TILE, 128 tokens at 3 stages
    against 2 without the flag; head dim 128: MHA_PREFETCH_TILE, 32 tokens at 3 stages with the page ids a tile
    ahead), and the output is within the float64 reference's tolerance (NaN-filled out and lse). With the default
    thresholds (4096 and 1024 tokens) or None the plan keeps the 2-stage tile."""
    from flashdecode import launcher

    monkeypatch.setattr(launcher, "ENABLED", False)
    c = case(lens, 3, 3, head_dim, 16, torch.bfloat16, device, seed=5, extra_table_columns=20)
    assert not plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table).long_tile
    threshold = "MHA_LONG_MIN_TOKENS" if head_dim == 64 else "MHA_PREFETCH_MIN_TOKENS"
    monkeypatch.setattr(plan_module, threshold, 128)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    name = "3-stage MHA tile" if head_dim == 64 else "32-token prefetching MHA tile"
    assert plan.long_tile and plan.num_splits > 1 and name in plan.reason, plan.reason
    stages = _partial_tiles(monkeypatch)
    long = (128, 3) if head_dim == 64 else (32, 3)
    for p, tile in ((plan, long), (dataclasses.replace(plan, long_tile=False), (128, 2))):
        _run_checked(c, p, torch.bfloat16)
        assert stages[-1] == tile
    monkeypatch.setattr(plan_module, threshold, None)
    assert not plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table).long_tile


def test_mha_long_tile_by_head_dim_and_rows():
    """The "mha" class's long tile: the prefetching 32-token one for one query row a KV head at head dim 128 only."""
    assert triton_splitk.mha_long_tile(128, 1) is triton_splitk.MHA_PREFETCH_TILE
    assert triton_splitk.MHA_PREFETCH_TILE["PREFETCH_PAGES"] and triton_splitk.MHA_PREFETCH_TILE["BLOCK_N"] == 32
    for block_d, rows in ((64, 1), (128, 2), (128, 3), (32, 1)):
        assert triton_splitk.mha_long_tile(block_d, rows) is triton_splitk.MHA_LONG_TILE


def test_plan_gives_grouped_rows_one_program_per_sm(device, monkeypatch):
    """Groups of 6 at head dim 128 in bf16 (the grouped prefetching tile) on 16 SMs: two sequences of 2048 tokens
    (4 KV-head programs) take 4 fixed splits of GROUPED_LONG_TILE (128 tokens, 3 stages; one program per SM) merged in
    the last split program, bit-identical to those splits forced and within the float64 reference's tolerance
    (NaN-filled out and lse). Shorter sequences (below GROUPED_LONG_MIN_TOKENS a split), a grid that would leave SMs
    idle, or the threshold None keep the 32-token tile's cut."""
    from flashdecode import launcher

    monkeypatch.setattr(launcher, "ENABLED", False)
    monkeypatch.setattr(api, "_num_sms", lambda dev: 16)
    c = case([2048, 2048], 12, 2, 128, 16, torch.bfloat16, device, seed=6)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert (plan.num_splits, plan.long_tile, plan.counters is not None) == (4, True, True), plan.reason
    tiles = _partial_tiles(monkeypatch)
    out, lse = _run_checked(c, plan, torch.bfloat16)
    assert tiles == [(128, 3)]
    forced = _nan_out(c), torch.full(c.q.shape[:-1], float("nan"), device=device)
    decode_splitk(*c.args, c.q.shape[-1] ** -0.5, *forced, num_splits=4, num_sms=16,
                  counters=torch.zeros_like(plan.counters), long_tile=True)  # fmt: skip
    assert torch.equal(out, forced[0]) and torch.equal(lse, forced[1])
    short = case([1500, 1500], 12, 2, 128, 16, torch.bfloat16, device, seed=6)
    assert "128-token" not in plan_decode(short.q, short.k_cache, short.cache_seqlens, short.block_table).reason
    monkeypatch.setattr(api, "_num_sms", lambda dev: 18)  # 4 splits x 4 = 16 programs: 89% of them
    assert "128-token" not in plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table).reason
    monkeypatch.setattr(api, "_num_sms", lambda dev: 16)
    monkeypatch.setattr(plan_module, "GROUPED_LONG_MIN_TOKENS", None)
    assert "128-token" not in plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table).reason


def test_plan_gives_grouped_rows_two_programs_per_sm(device, monkeypatch):
    """One sequence of 2048 tokens at 12/2 (2 KV-head programs) on 16 SMs: the cut's 16 splits of the 32-token tile
    become 8 of GROUPED_MID_TILE (64 tokens, 3 stages; about two programs per SM) merged by the combine launch,
    bit-identical to those splits forced and within the float64 reference's tolerance. Splits of fewer than
    GROUPED_MID_MIN_TILES tiles, or the rule off, keep the cut."""
    from flashdecode import launcher

    monkeypatch.setattr(launcher, "ENABLED", False)
    monkeypatch.setattr(api, "_num_sms", lambda dev: 16)
    c = case([2048], 12, 2, 128, 16, torch.bfloat16, device, seed=7)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert (plan.num_splits, plan.long_tile, plan.counters) == (8, True, None), plan.reason
    tiles = _partial_tiles(monkeypatch)
    out, lse = _run_checked(c, plan, torch.bfloat16)
    assert tiles == [(64, 3)]
    forced = _nan_out(c), torch.full(c.q.shape[:-1], float("nan"), device=device)
    decode_splitk(*c.args, c.q.shape[-1] ** -0.5, *forced, num_splits=8, num_sms=16, long_tile=True)
    assert torch.equal(out, forced[0]) and torch.equal(lse, forced[1])
    short = case([1024], 12, 2, 128, 16, torch.bfloat16, device, seed=7)
    assert not plan_decode(short.q, short.k_cache, short.cache_seqlens, short.block_table).long_tile
    monkeypatch.setattr(plan_module, "GROUPED_MID_MIN_FILL", None)
    assert plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table).num_splits == 16


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("q_len", [1, 2])
def test_deep_mha_tile_with_features(q_len, head_dim, device, small_gpu, monkeypatch):
    """The MHA class's long tiles (3 stages; at head dim 128 with one token the 32-token prefetching one) with
    softcap, ALiBi, sinks and a window together, one or two query tokens: the plan's call within the float64
    reference's tolerance, NaN-filled out and lse (on the GPU this compiles the long kernels with every feature; the
    interpreter ignores stages but runs the same code)."""
    from flashdecode import launcher

    monkeypatch.setattr(launcher, "ENABLED", False)
    monkeypatch.setattr(plan_module, "MHA_LONG_MIN_TOKENS", 1)
    monkeypatch.setattr(plan_module, "MHA_PREFETCH_MIN_TOKENS", 1)
    monkeypatch.setattr(plan_module, "MHA_LONG_MIN_FILL", 0.0)
    c = case([512], 3, 3, head_dim, 16, torch.bfloat16, device, seed=8, extra_table_columns=20)
    shape = (1, q_len, 3, head_dim)
    q = c.q if q_len == 1 else torch.randn(*shape, generator=torch.Generator().manual_seed(2)).to(c.q)
    g = torch.Generator().manual_seed(4)
    kw = dict(softcap=20.0, alibi_slopes=torch.rand(3, generator=g).to(device),
              sinks=torch.randn(3, generator=g).to(device), window_left=300)  # fmt: skip
    args = (q,) + c.args[1:]
    plan = plan_decode(*args[:2], *args[3:], window_left=300)
    assert plan.long_tile and plan.num_splits > 1, plan.reason
    assert ("prefetching" in plan.reason) == (head_dim == 128 and q_len == 1), plan.reason
    _run_checked_features(args, plan, **kw)


@pytest.mark.parametrize(
    "prefetch, chunk, programs, long",
    [(False, 4096, 384, True), (False, 8192, 396, True), (False, 4096, 792, True), (False, 2048, 384, False),
     (False, 8192, 320, False), (False, 8192, 288, False), (False, 8192, 400, False),
     (True, 1024, 384, True), (True, 2048, 384, True), (True, 4096, 792, True), (True, 512, 384, False),
     (True, 1000, 396, False), (True, 2048, 320, False), (True, 8192, 400, False)],
)  # fmt: skip
def test_mha_long_rule(prefetch, chunk, programs, long):
    """The rule as measured on the H200 (132 SMs, 3 programs each: waves of 396): a grid whose last wave is at least
    90% full, with chunks of 4096 tokens or more for the 3-stage tile (2048-token chunks and grids of 320, 288 or 400
    programs keep the 2-stage tile) and of 1024 or more for the prefetching tile (head dim 128, one row)."""
    assert plan_module._mha_long(chunk, programs, 3 * 132, prefetch=prefetch) == long


@pytest.mark.parametrize(
    "lens, single",
    [([256, 256], True), ([1100, 1100], False), ([256, 256, 256], False), ([400, 20], False)],
    ids=["fills-4-of-4", "longer-than-1024", "fills-6-of-8", "uneven"],
)
def test_plan_runs_the_single_pass_where_it_fills_the_sms(lens, single, device, small_gpu):
    """SINGLE_FULL_*: on the grouped prefetching tile (bf16, head dim 128, 8/2 heads) an even batch of at most 1024
    tokens a sequence whose single pass gives every SM 1 or 2 programs (4 programs on 4 SMs) runs the single pass; a
    longer one, one that leaves SMs short (6 programs on 4 SMs: 2, 2, 1, 1) or an uneven one keeps the splits. The
    single pass's output is within the reference's tolerance (NaN-filled out and lse)."""
    c = case(lens, 8, 2, 128, 16, torch.bfloat16, device, seed=7, extra_table_columns=80)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert ((plan.backend, plan.num_splits) == ("triton", 1)) == single, plan.reason
    assert single == plan.reason.startswith("even short lengths"), plan.reason
    if single:
        _run_checked(c, plan, torch.bfloat16)


def test_plan_with_a_window_cuts_the_visible_tokens(device, small_gpu):
    """window_left: the plan reads visible lengths (40 each here, one chunk: the single pass)."""
    c = _case([400, 20], device)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table, window_left=39)
    assert (plan.backend, plan.num_splits) == ("triton", 1), plan.reason
    out = decode_attention(*c.args, plan=plan, window_left=39, out=_nan_out(c))
    ref_out, _ = reference_of(c, window_left=39)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float32, window_left=39)


def test_plan_on_cpu_without_triton_keeps_the_feature_rule(monkeypatch):
    """Without a GPU or the interpreter the plan is PyTorch's; a call with a feature (softcap) then still goes to
    the backend that implements it, whatever the plan recorded."""
    from flashdecode import triton_common

    monkeypatch.setattr(triton_common, "interpreting", lambda: False)
    c = _case([50, 30], "cpu")
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert plan.backend == "torch_sdpa", plan.reason
    out = decode_attention(*c.args, plan=plan, softcap=5.0)
    ref_out, _ = reference_of(c, softcap=5.0)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float32, softcap=5.0)


def test_plan_errors_name_the_argument(device):
    c = _case([20, 30], device)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    with pytest.raises(TypeError, match="plan must be None or a DecodePlan.*got str"):
        decode_attention(*c.args, plan="fast")
    for kwargs in (dict(backend="triton"), dict(num_splits=2), dict(deterministic=True)):
        with pytest.raises(ValueError, match="plan chooses the kernels"):
            decode_attention(*c.args, plan=plan, **kwargs)
    other = _case([20, 30, 40], device)
    with pytest.raises(ValueError, match=r"batch 2 \(call: 3\)"):
        decode_attention(*other.args, plan=plan)
    with pytest.raises(ValueError, match=r"window_left None \(call: 7\)"):
        decode_attention(*c.args, plan=plan, window_left=7)
    with pytest.raises(TypeError, match="cache_seqlens must be int32"):
        plan_decode(c.q, c.k_cache, c.cache_seqlens.long(), c.block_table)
    # the lengths it reads: one past the table sized the plan from it (2^31 - 1: 16385 chunks a sequence)
    width = c.block_table.shape[1] * c.k_cache.shape[1]
    for bad in (-3, width + 1, 2**31 - 1):
        lens = torch.tensor([20, bad], dtype=torch.int32, device=device)
        with pytest.raises(ValueError, match=rf"cache_seqlens\[1\] = {bad} must lie in \[0, {width}\]"):
            plan_decode(c.q, c.k_cache, lens, c.block_table)
    assert isinstance(plan, DecodePlan) and plan.reason
    with pytest.raises(ValueError, match="num_splits must be None or an int >= 1"):
        dataclasses.replace(plan, num_splits=0)
    with pytest.raises(ValueError, match="in_order is for the single pass"):
        dataclasses.replace(plan, backend="triton_splitk", num_splits=2, in_order=True)
    counters = torch.zeros(2 * 8, dtype=torch.int32, device=device)
    for bad in (dict(counters=counters.long()), dict(counters=counters[:3]), dict(num_splits=1, counters=counters)):
        with pytest.raises(ValueError, match="counters must be an int32 tensor of at least B"):
            dataclasses.replace(plan, backend="triton_splitk", **dict(dict(num_splits=2), **bad))


@pytest.mark.parametrize("most", [12, triton_splitk.HOST_FUSED_MAX_CHUNKS + 1])
def test_host_table_merges_in_the_last_chunk_up_to_the_limit(device, small_gpu, monkeypatch, most):
    """A host table whose longest sequence has up to HOST_FUSED_MAX_CHUNKS chunks holds counters (its last chunk
    program merges, past the device planner's FUSED_EXPECTED_CHUNKS); one more chunk sends it to the combine launch.
    Both give the reference, and the counters are zero after each call."""
    assert triton_splitk.FUSED_EXPECTED_CHUNKS < 12 <= triton_splitk.HOST_FUSED_MAX_CHUNKS
    lens = [1100, 40, 300]
    monkeypatch.setattr(triton_splitk, "host_cut", lambda visible, *a: [most, 1, 2])
    c = _case(lens, device)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert plan.table is not None and len(plan.table[0]) == most + 3 + len(lens), plan.reason
    assert (plan.counters is not None) == (most <= triton_splitk.HOST_FUSED_MAX_CHUNKS), plan.reason
    for _ in range(2):
        _run_checked(c, plan)
        if plan.counters is not None:
            assert not plan.counters.any()


def test_host_table_for_uneven_batches(device, small_gpu):
    """An uneven batch's plan carries a host-made cut: every chunk slot once in its dispatch order (longest first),
    each sequence's chunks covering its tiles; a plan made for other lengths (longer, shorter, empty) still gives
    the reference, and its merge counters are zero after every call."""
    lens = [300, 17, 0, 120, 45, 260]
    c = _case(lens, device)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert plan.table is not None and plan.num_splits is None, plan.reason
    seqs, starts, ends, ids = plan.table.cpu().tolist()
    chunks = len(seqs) - len(lens)
    assert sorted(ids[:chunks]) == list(range(chunks))
    sizes = [min(ends[i], lens[seqs[i]]) - starts[i] for i in range(chunks)]
    assert sizes == sorted(sizes, reverse=True)
    # grid slot of each chunk id
    slot = {c: i for i, c in enumerate(ids[:chunks])}
    for b, n in enumerate(lens):
        first, count = seqs[chunks + b], starts[chunks + b]
        mine = [slot[c] for c in range(first, first + count)]
        assert [seqs[i] for i in mine] == [b] * count and starts[mine[0]] == 0
        assert [ends[i] for i in mine[:-1]] == [starts[i] for i in mine[1:]]
        assert ends[mine[-1]] == triton_splitk.OPEN_END
    _run_checked(c, plan)
    # the plan of other lengths: each sequence longer, shorter or empty than the call's
    other = torch.tensor([90, 250, 30, 0, 300, 16], dtype=torch.int32, device=c.q.device)
    stale = plan_decode(c.q, c.k_cache, other, c.block_table)
    assert stale.table is not None, stale.reason
    for _ in range(2):
        _run_checked(c, stale)
        if stale.counters is not None:
            assert not stale.counters.any()
