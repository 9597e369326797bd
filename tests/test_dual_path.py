"""Dual-path calls: the single pass and the planned kernels launched together, the lengths choosing on the device.

Every kernel of such a call computes ``even_batch`` from the lengths; on an even batch only the single pass writes,
otherwise only the planned path does. The tests check which path wrote by bit-identity with each path run alone,
on both sides of the threshold, and against the float64 reference with NaN-poisoned outputs.
"""

import functools

import pytest
import torch
from helpers import case, lse_err, lse_tolerance, max_err, output_tolerance, reference_of

from flashdecode import api, decode_attention, launcher, triton_common
from flashdecode.triton_common import Features, even_lengths
from flashdecode.triton_single import decode_single
from flashdecode.triton_splitk import decode_splitk

SCALE = 0.125


def _run(c, device, mode, features=None, num_sms=8):
    """(out, lse) of one path: "single", "planned" or "dual", into NaN-filled buffers, at the reference's default
    scale (1 / sqrt(D)). "single" is the tl kernel, the one a dual-path call launches (its grid may be one that
    decode_single alone gives to gluon_single, whose LSE differs in the last bits)."""
    out = torch.full_like(c.q, float("nan"))
    lse = torch.full(c.q.shape[:-1], float("nan"), device=device)
    scale = c.q.shape[-1] ** -0.5
    if mode == "single":
        decode_single(*c.args, scale, out, lse, features=features, num_sms=num_sms, gluon=False)
    else:
        decode_splitk(
            *c.args, scale, out, lse, num_sms=num_sms, features=features, dual_path=mode == "dual"
        )  # fmt: skip
    return out, lse


# B = 2 at the threshold: even iff max * 2 * 2 <= (max + min) * 3, i.e. max <= 3 * min
@pytest.mark.parametrize(
    "lens,even",
    [([150, 50], True), ([160, 50], False), ([100, 100, 100, 100], True), ([300, 20, 20, 20], False), ([0, 0], True)],
    ids=["edge-even", "edge-uneven", "uniform", "ragged", "all-empty"],
)
@pytest.mark.parametrize("inline", [False, True], ids=["planner", "in-place"])
def test_dual_path_call_takes_one_path(lens, even, inline, device, monkeypatch):
    """An even batch is written by the single pass alone, an uneven one by the planned path alone (bit-identical to
    each run by itself), and both match the reference, LSE included."""
    from flashdecode import triton_splitk

    assert even_lengths(lens) == even
    monkeypatch.setattr(triton_splitk, "INLINE_PLAN_MAX_BATCH", 16 if inline else 0)
    c = case(lens, 8, 2, 64, 16, torch.float32, device, seed=31)
    out, lse = _run(c, device, "dual")
    alone = _run(c, device, "single" if even else "planned")
    assert torch.equal(out, alone[0]) and torch.equal(lse, alone[1])
    other = _run(c, device, "planned" if even else "single")
    if sum(lens):
        # the two paths round differently, so bit-identity above says which one wrote
        assert not torch.equal(out, other[0])
    ref_out, ref_lse = reference_of(c)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float32)
    assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)


def test_dual_path_evenness_counts_visible_tokens(device):
    """With a sliding window the test is on the visible lengths: [400, 64] is uneven, but with a 63-token window
    both sequences see 64 tokens, so the single pass writes."""
    lens = [400, 64]
    c = case(lens, 8, 2, 64, 16, torch.float32, device, seed=32)
    window = Features(window_left=63)
    assert not even_lengths(lens) and even_lengths(lens, window_left=63)
    out, lse = _run(c, device, "dual", features=window)
    alone = _run(c, device, "single", features=window)
    assert torch.equal(out, alone[0]) and torch.equal(lse, alone[1])
    ref_out, _ = reference_of(c, window_left=63)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float32)


def test_auto_takes_the_dual_path_between_two_programs_per_sm_and_the_planner_target(monkeypatch):
    """auto: B * Hkv below 2 per SM plans, from 2 per SM to the planner's target takes the dual path, above runs the
    single pass; all from shapes (meta tensors)."""
    monkeypatch.setattr(api, "_num_sms", lambda dev: 4)
    monkeypatch.setattr(triton_common, "interpreting", lambda: True)
    # the planned side without the small-table rule (test_splitk.py::test_auto_small_table_takes_capacity_splits)
    monkeypatch.setattr(api, "CAPACITY_SPLITS_MAX_TOKENS", 0)

    def choice(batch):
        q = torch.empty(batch, 8, 128, device="meta", dtype=torch.bfloat16)
        k = torch.empty(100, 16, 2, 128, device="meta", dtype=torch.bfloat16)
        return api._choose_backend("auto", None, q, k, torch.empty(batch, 50, device="meta", dtype=torch.int32))

    # Hkv 2, 4 SMs, grouped tile target 4: dual path for B * 2 in [8, 16); a full grid's 800-token table runs the
    # single pass (below FULL_GRID_DUAL_MIN_TOKENS; its dual path: test_full_grid_dual.py)
    dual, single = ("triton_splitk", api.DUAL_PATH), ("triton", 1)
    assert [choice(b) for b in (3, 4, 7, 8)] == [("triton_splitk", None), dual, dual, single]


def test_auto_dual_path_call_matches_reference(device, monkeypatch):
    """Through decode_attention: a ragged and an even batch in the dual-path range, NaN-poisoned outputs."""
    # B * Hkv = 8 programs on 3 SMs: 2 to 4 per SM
    monkeypatch.setattr(api, "_num_sms", lambda dev: 3)
    for lens in ([300, 300, 300, 300], [600, 3, 17, 0]):
        c = case(lens, 8, 2, 64, 16, torch.bfloat16, device, seed=33)
        assert api._choose_backend("auto", None, c.q, c.k_cache, c.block_table)[1] is api.DUAL_PATH
        out, lse = decode_attention(*c.args, return_lse=True, out=torch.full_like(c.q, float("nan")))
        ref_out, ref_lse = reference_of(c)
        assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)
        assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)


@pytest.mark.parametrize("inline", [False, True], ids=["planner", "in-place"])
def test_each_path_is_idle_on_the_other_paths_batches(inline, device, monkeypatch):
    """Run alone, the dual-path single pass writes nothing on an uneven batch, and the dual-path planned kernels
    write nothing on an even one (on the GPU both paths run at once, so a write by the wrong one would race)."""
    from flashdecode import triton_splitk

    monkeypatch.setattr(triton_splitk, "INLINE_PLAN_MAX_BATCH", 16 if inline else 0)
    uneven = case([300, 20, 20, 20], 8, 2, 64, 16, torch.float32, device, seed=34)
    out = torch.full_like(uneven.q, float("nan"))
    decode_single(*uneven.args, SCALE, out, None, num_sms=8, even_only=True)
    assert out.isnan().all()
    even = case([100, 100, 100, 100], 8, 2, 64, 16, torch.float32, device, seed=35)
    monkeypatch.setattr(triton_splitk, "decode_single", lambda *a, **k: None)
    out = torch.full_like(even.q, float("nan"))
    lse = torch.full(even.q.shape[:-1], float("nan"), device=device)
    decode_splitk(*even.args, SCALE, out, lse, num_sms=8, dual_path=True)
    assert out.isnan().all() and lse.isnan().all()


# the length gate: 2 SMs, Hkv 2, group 4 (grouped tile, R = 4): a wave is 8 single-pass programs. B = 5 gives 10, one
# wave and a last one of 2; B = 9 gives 18, two waves and 2; both within TAIL_WAVES. The gate's threshold is scaled
# down to 256 tokens for the interpreter's sake (LONG_MEAN is a kernel argument like any other), with tables of 640
# tokens; at 600 tokens the gate's extra chunk slots change the planned cut of the whole batch (15 chunks instead of
# 10)
TAIL_SMS = 2
TAIL_LONG = 256


def _tail_case(lens, seed, device, monkeypatch):
    """A bf16 case whose table holds 40 pages (640 tokens) whatever the lengths, under a 256-token gate."""
    from flashdecode import triton_splitk

    monkeypatch.setattr(triton_splitk, "TAIL_LONG_TOKENS", TAIL_LONG)
    # the gate's waves of 4 programs per SM for the GQA tile, also within one wave of PREFETCH_TILE_PER_SM (whose
    # single pass has no tail on a GPU: test_tail_range_by_tile_class)
    monkeypatch.setattr(triton_splitk, "PREFETCH_TILE_PER_SM", 4)
    # 64-token steps for the fused merge, whose tile on a GPU is the single pass's (32-token steps): the two paths'
    # LSEs then differ in their last bits, which tells which path wrote
    split_config = triton_splitk.split_config

    def fused_64(head_dim, group, dtype, q_len, kv_itemsize, num_kv_heads, fused, *args, **kwargs):
        cfg, saturation, tile = split_config(
            head_dim, group, dtype, q_len, kv_itemsize, num_kv_heads, fused, *args, **kwargs
        )  # fmt: skip
        return ({**cfg, "BLOCK_N": 64, "PREFETCH_PAGES": False} if fused else cfg), saturation, tile

    monkeypatch.setattr(triton_splitk, "split_config", fused_64)
    # single_pass_tail's answers depend on the gate: a cache of this test's own
    fresh = functools.lru_cache(triton_splitk.single_pass_tail.__wrapped__)
    monkeypatch.setattr(triton_splitk, "single_pass_tail", fresh)
    return case(lens, 8, 2, 128, 16, torch.bfloat16, device, seed=seed, extra_table_columns=40 - -(-max(lens) // 16))


def _tail_first(batch):
    from flashdecode import triton_splitk

    first, long_tokens = triton_splitk.single_pass_tail(batch, 128, 4, torch.bfloat16, 1, 2, 2, TAIL_SMS, 640)
    assert long_tokens == TAIL_LONG
    return first


def _planned_from(c, first, device):
    """(out, lse) of the planned path run alone on sequences first.. (a batch of its own), NaN-filled buffers."""
    q, k_cache, v_cache, seqlens, table = c.args
    out = torch.full_like(q[first:], float("nan"))
    lse = torch.full(q[first:].shape[:-1], float("nan"), device=device)
    decode_splitk(q[first:], k_cache, v_cache, seqlens[first:], table[first:], q.shape[-1] ** -0.5, out, lse,
                  num_sms=TAIL_SMS)  # fmt: skip
    return out, lse


def _tail_expected(c, lens, device, monkeypatch):
    """What a dual-path call under the gate must write, from the paths run alone: the single pass for an even short
    batch; for an even long one the single pass up to the sequence single_pass_tail names and the planned path (with
    the gate's chunk slots) from there; the planned path for an uneven one. Also the path that must not have
    written the whole batch."""
    from flashdecode import triton_splitk

    first = _tail_first(len(lens))
    single = _run(c, device, "single", num_sms=TAIL_SMS)
    # under the gate the planned path gets TAIL_EXTRA_PROGRAMS_PER_SM chunk slots (a finer cut of long batches)
    monkeypatch.setattr(triton_splitk, "EXTRA_PROGRAMS_PER_SM", triton_splitk.TAIL_EXTRA_PROGRAMS_PER_SM)
    launcher.clear()
    planned = _run(c, device, "planned", num_sms=TAIL_SMS)
    if even_lengths(lens, long_mean=TAIL_LONG):
        return single, planned
    if not even_lengths(lens):
        return planned, single
    tail = _planned_from(c, first, device)
    return tuple(torch.cat([s[:first], t]) for s, t in zip(single, tail)), planned


@pytest.mark.parametrize(
    "lens,even,single",
    [
        ([150] * 5, True, True), ([600] * 5, True, False), ([600, 60, 60, 60, 60], False, False),
        ([600] * 9, True, False),
    ],  # fmt: skip
    ids=["even-short", "even-long", "uneven", "even-long-2-waves"],
)
def test_tail_gate_splits_long_batches(lens, even, single, device, monkeypatch):
    """Where the single pass would end on a nearly empty wave (``single_pass_tail``), a dual-path call takes the
    single pass only for an even batch of mean visible length < TAIL_LONG_TOKENS; an even long one is split (the
    single pass for the sequences of the full waves, the planned path for the rest) and an uneven one planned.
    Bit-identical to the paths run alone, different from the wrong one, and matching the reference."""
    c = _tail_case(lens, 36, device, monkeypatch)
    assert _tail_first(len(lens)) == (4 if len(lens) == 5 else 8)
    assert even_lengths(lens, long_mean=TAIL_LONG) == single and even_lengths(lens) == even
    out, lse = _run(c, device, "dual", num_sms=TAIL_SMS)
    (want_out, want_lse), other = _tail_expected(c, lens, device, monkeypatch)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    # bf16 outputs may round alike; the fp32 LSEs of the paths differ
    assert not torch.equal(lse, other[1])
    ref_out, ref_lse = reference_of(c)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)
    assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)


@pytest.mark.parametrize("batch", [5, 9])
def test_tail_gate_paths_write_only_their_sequences(batch, device, monkeypatch):
    """Under the length gate each path of a dual-path call, run alone, writes exactly its part (on the GPU they run
    at once, so a write by the wrong one would race): on an even long batch the single pass the sequences before
    single_pass_tail's and the planned kernels the others; on an even short one the planned kernels nothing."""
    from flashdecode import triton_splitk

    long = _tail_case([600] * batch, 37, device, monkeypatch)
    first = _tail_first(batch)
    out = torch.full_like(long.q, float("nan"))
    decode_single(*long.args, SCALE, out, None, num_sms=TAIL_SMS, even_only=True, long_mean=TAIL_LONG,
                  tail_first=first)  # fmt: skip
    assert not out[:first].isnan().any() and out[first:].isnan().all()
    monkeypatch.setattr(triton_splitk, "decode_single", lambda *a, **k: None)
    out = torch.full_like(long.q, float("nan"))
    lse = torch.full(long.q.shape[:-1], float("nan"), device=device)
    decode_splitk(*long.args, SCALE, out, lse, num_sms=TAIL_SMS, dual_path=True)
    assert out[:first].isnan().all() and lse[:first].isnan().all()
    assert not out[first:].isnan().any() and not lse[first:].isnan().any()
    short = _tail_case([150] * batch, 38, device, monkeypatch)
    out = torch.full_like(short.q, float("nan"))
    lse = torch.full(short.q.shape[:-1], float("nan"), device=device)
    decode_splitk(*short.args, SCALE, out, lse, num_sms=TAIL_SMS, dual_path=True)
    assert out.isnan().all() and lse.isnan().all()


def test_auto_takes_the_dual_path_where_the_single_pass_would_end_on_a_nearly_empty_wave(monkeypatch):
    """auto, from shapes: a full grid (B * Hkv >= R * #SMs) runs the single pass (without FULL_GRID_DUAL_PATH, whose
    dual path would hide the difference), except where its last wave is filled to at most TAIL_WAVES - 1
    (TAIL_FULLER - 1 with a table of TAIL_FULLER_TOKENS) with a table of at least TAIL_LONG_TOKENS: there it takes
    the dual path with the length gate; not for fp32 caches (the measured tiles are 16-bit) nor shorter tables."""
    from flashdecode import triton_splitk

    monkeypatch.setattr(api, "FULL_GRID_DUAL_PATH", False)
    monkeypatch.setattr(api, "_num_sms", lambda dev: 4)
    monkeypatch.setattr(triton_common, "interpreting", lambda: True)
    # waves of 4 also within one wave of PREFETCH_TILE_PER_SM (as _tail_case), with a cache of this test's own
    monkeypatch.setattr(triton_splitk, "PREFETCH_TILE_PER_SM", 4)
    fresh = functools.lru_cache(triton_splitk.single_pass_tail.__wrapped__)
    monkeypatch.setattr(triton_splitk, "single_pass_tail", fresh)

    def choice(batch, pages=100, dtype=torch.bfloat16):
        q = torch.empty(batch, 8, 128, device="meta", dtype=dtype)
        k = torch.empty(100, 16, 2, 128, device="meta", dtype=dtype)
        return api._choose_backend("auto", None, q, k, torch.empty(batch, pages, device="meta", dtype=torch.int32))

    # Hkv 2, 4 SMs, grouped tile target 4: a wave is 16 programs; B = 9..11 gives 16 + 2..6, B = 17..19 32 + 2..6,
    # a last wave filled to at most 0.4; with a 4096-token table also 16 + 8 and 32 + 8 (0.5)
    dual, single = ("triton_splitk", api.DUAL_PATH), ("triton", 1)
    batches = (8, 9, 11, 12, 13, 16, 17, 19, 20, 21)
    assert [choice(b) for b in batches] == [single, dual, dual, single, single, single, dual, dual, single, single]
    long_table = [choice(b, pages=256) for b in batches]
    assert long_table == [single, dual, dual, dual, single, single, dual, dual, dual, single]
    assert choice(9, pages=63) == single and choice(9, dtype=torch.float32) == single


def test_tail_range_by_tile_class():
    """The single pass's programs per SM and the last waves the gate covers, by tile class on an H200 (132 SMs), with
    the first sequence of the last wave and the mean length from which an even batch is split: MHA 12/12 (3 per
    SM, filled to 0.4 from 1024 tokens, to 0.55 from 4096), GQA 32/8 (4 beyond one wave of 5, the same), the
    small-group class 32/32 (its single pass fits 3 per SM, 0.3) and head dim 256 (2, 0.25); not at head dim 64,
    whose tiles were not measured."""
    from flashdecode.triton_splitk import TAIL_WAVES, single_pass_tail

    def tail(batch, hq, hkv, head_dim=128):
        return single_pass_tail(batch, head_dim, hq // hkv, torch.bfloat16, 1, 2, hkv, 132, 8192)

    near, far = (33, 1024), (33, 4096)
    assert [tail(b, 12, 12) for b in (33, 34, 46, 47, 51, 52)] == [None, near, near, far, far, None]
    assert [tail(b, 12, 12) for b in (66, 67, 79, 80, 84, 85)] == [None, (66, 1024), (66, 1024), (66, 4096),
                                                                   (66, 4096), None]  # fmt: skip
    near, far = (66, 1024), (66, 4096)
    # the GQA tile's single pass holds PREFETCH_TILE_PER_SM = 5 programs per SM up to one wave of them (82 sequences
    # of 8 KV heads), then runs the 4-stage tile in waves of 4
    assert [tail(b, 32, 8) for b in (66, 67, 82, 83, 92, 93, 102, 103)] == [None, None, None, near, near, far, far,
                                                                         None]  # fmt: skip
    assert tail(133, 32, 8) == (132, 1024) and tail(168, 32, 8) == (132, 4096) and tail(169, 32, 8) is None
    # 396 programs a wave: the 12 sequences of 32 KV heads that fit
    assert [tail(b, 32, 32) for b in (12, 13, 16, 17)] == [None, (12, 1024), (12, 1024), None]
    assert [tail(b, 32, 8, 256) for b in (33, 34, 41, 42)] == [None, (33, 1024), (33, 1024), None]
    assert tail(34, 32, 8, 64) is None
    # auto skips the lookup below 2 programs per SM (api._choose_backend)
    assert min(per_sm for per_sm, _ in TAIL_WAVES.values()) >= 2
