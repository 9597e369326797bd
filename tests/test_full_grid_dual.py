"""A full grid's dual path (``triton_splitk.full_grid_span``): B * Hkv at least the planner's target per SM, so the
single pass runs in waves, longest first. Its evenness test is taken over the SPAN sequences one wave holds instead
of the batch: the single pass keeps every batch whose longest sequence fits a wave slot's share of the work (an
uneven one dispatched longest first), the planned kernels take one long sequence among many short ones. As in
test_dual_path.py, which path wrote is told by bit-identity with each path run alone (fp32: the two round
differently), and each path run alone must write nothing on the other's batches (on a GPU they run at once).
"""

import pytest
import torch
from helpers import case, lse_err, lse_tolerance, max_err, output_tolerance, reference_of

from flashdecode import api, decode_attention, plan_decode, triton_splitk
from flashdecode.triton_common import Features, even_lengths, longest_first_order
from flashdecode.triton_single import decode_single
from flashdecode.triton_splitk import decode_splitk, full_grid_span

# 2 SMs, Hkv 2, group 4 (the grouped tile, target 4): a wave holds 4 * 2 / 2 = 4 sequences; 8 sequences (16
# single-pass programs, two waves) are a full grid
SMS, HKV, HQ, D = 2, 2, 8, 64
SPAN = 4
BATCHES = {
    # even: the single pass, in batch order
    "even": [100] * 8,
    # uneven over the batch (160 * 8 * 2 > 608 * 3) but not over a wave (160 * 4 * 2 <= 608 * 3): the single pass,
    # longest first
    "uneven-fits": [64] * 7 + [160],
    # one long sequence among short ones (400 * 4 * 2 > 512 * 3): the planned path
    "straggler": [16] * 3 + [400] + [16] * 4,
    "all-empty": [0] * 8,
}
SINGLE = {"even": True, "uneven-fits": True, "straggler": False, "all-empty": True}


@pytest.fixture(autouse=True)
def short_tables(monkeypatch):
    """`auto` takes the full grid's dual path for tables of FULL_GRID_DUAL_MIN_TOKENS (1024) tokens or more; these
    tests' tables hold 256-400 (the interpreter's cost), so the limit comes down to 256."""
    monkeypatch.setattr(api, "FULL_GRID_DUAL_MIN_TOKENS", 256)


def _nan(c):
    return torch.full_like(c.q, float("nan")), torch.full(c.q.shape[:-1], float("nan"), device=c.q.device)


def _run(c, mode, features=None):
    """(out, lse) of "single" (longest first, alone), "planned" (alone) or "dual" (the full grid's call)."""
    out, lse = _nan(c)
    scale = c.q.shape[-1] ** -0.5
    if mode == "single":
        decode_single(*c.args, scale, out, lse, features=features, num_sms=SMS, longest_first=True)
    else:
        decode_splitk(*c.args, scale, out, lse, num_sms=SMS, features=features, dual_path=mode == "dual")
    return out, lse


def test_span_is_a_waves_sequences_in_a_full_grid():
    assert full_grid_span(8, HKV, SMS, 4) == SPAN
    # below a full grid (and at exactly one wave) the test is over the batch
    assert full_grid_span(4, HKV, SMS, 4) == 0 and full_grid_span(3, HKV, SMS, 4) == 0
    # H200 (132 SMs), 32/8: 66 sequences a wave of 4 per SM; 12/12 (3 per SM): 33
    assert full_grid_span(128, 8, 132, 4) == 66 and full_grid_span(256, 12, 132, 3) == 33
    assert triton_splitk.planner_target(D, HQ // HKV, torch.float32, 1, 4, HKV) == 4


@pytest.mark.parametrize("name", list(BATCHES))
def test_full_grid_dual_path_takes_one_path(name, device):
    """The single pass writes a batch that fits a wave, the planned path a straggler batch (bit-identical to the path
    run alone); both match the reference, LSE included."""
    lens = BATCHES[name]
    assert even_lengths(lens, span=SPAN) == SINGLE[name]
    assert even_lengths(lens) == (name in ("even", "all-empty"))
    c = case(lens, HQ, HKV, D, 16, torch.float32, device, seed=41)
    out, lse = _run(c, "dual")
    alone = _run(c, "single" if SINGLE[name] else "planned")
    assert torch.equal(out, alone[0]) and torch.equal(lse, alone[1])
    if not SINGLE[name]:
        # the planned path splits the long sequence, so the single pass would round differently; on the batches that
        # fit a wave it gives each sequence one chunk, the single pass's arithmetic (which path wrote there:
        # test_each_path_is_idle_on_the_other_paths_batches)
        other = _run(c, "single")
        assert not torch.equal(out, other[0])
    ref_out, ref_lse = reference_of(c)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float32)
    assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)


def test_each_path_is_idle_on_the_other_paths_batches(device, monkeypatch):
    """Run alone, the full grid's single pass writes nothing on a straggler batch, and its planned kernels write
    nothing on a batch that fits a wave, uneven ones included."""
    straggler = case(BATCHES["straggler"], HQ, HKV, D, 16, torch.float32, device, seed=42)
    out, lse = _nan(straggler)
    decode_single(*straggler.args, 0.125, out, lse, num_sms=SMS, even_only=True, even_span=SPAN, longest_first=True)
    assert out.isnan().all() and lse.isnan().all()
    monkeypatch.setattr(triton_splitk, "decode_single", lambda *a, **k: None)
    for name in ("even", "uneven-fits"):
        c = case(BATCHES[name], HQ, HKV, D, 16, torch.float32, device, seed=43)
        out, lse = _nan(c)
        decode_splitk(*c.args, 0.125, out, lse, num_sms=SMS, dual_path=True)
        assert out.isnan().all() and lse.isnan().all(), name


def test_the_test_counts_visible_tokens(device):
    """With a 63-token window the straggler batch's sequences each see at most 64 tokens: the single pass writes."""
    lens = BATCHES["straggler"]
    window = Features(window_left=63)
    assert not even_lengths(lens, span=SPAN) and even_lengths(lens, window_left=63, span=SPAN)
    c = case(lens, HQ, HKV, D, 16, torch.float32, device, seed=44)
    out, lse = _run(c, "dual", features=window)
    alone = _run(c, "single", features=window)
    assert torch.equal(out, alone[0]) and torch.equal(lse, alone[1])
    ref_out, _ = reference_of(c, window_left=63)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float32, window_left=63)


def test_the_single_pass_gate_matches_the_host_mirror(device):
    """longest_first's `ours` (the single pass's gate) against even_lengths(span=...) on random batches, and the
    order it gives the batches it keeps."""
    import random

    from test_longest_first import _slots

    g = random.Random(7)
    for _ in range(12):
        batch = g.randint(2, 40)
        lens = [g.choice([0, g.randint(1, 300), g.randint(1, 3000)]) for _ in range(batch)]
        span = g.randint(1, batch)
        seq, _, ours = _slots(lens, None, device, span=span)
        assert ours == [int(even_lengths(lens, span=span))] * batch, (lens, span)
        if even_lengths(lens, span=span):
            assert seq == longest_first_order(lens)


def test_auto_takes_the_full_grid_dual_path(device, monkeypatch):
    """auto on a full grid: the dual path where PDL (or the interpreter) allows it, through decode_attention with
    NaN-poisoned outputs; without FULL_GRID_DUAL_PATH, the single pass."""
    monkeypatch.setattr(api, "_num_sms", lambda dev: SMS)
    for name in ("uneven-fits", "straggler"):
        # a table of at least 20 pages: sequences that can hold more than SINGLE_PASS_MAX_TOKENS
        lens = BATCHES[name]
        extra = max(2, 20 - -(-max(lens) // 16))
        c = case(lens, HQ, HKV, D, 16, torch.bfloat16, device, seed=45, extra_table_columns=extra)
        assert api._choose_backend("auto", None, c.q, c.k_cache, c.block_table) == ("triton_splitk", api.DUAL_PATH)
        out, lse = decode_attention(*c.args, return_lse=True, out=torch.full_like(c.q, float("nan")))
        ref_out, ref_lse = reference_of(c)
        assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.bfloat16)
        assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)
    monkeypatch.setattr(api, "FULL_GRID_DUAL_PATH", False)
    assert api._choose_backend("auto", None, c.q, c.k_cache, c.block_table) == ("triton", 1)
    # a table shorter than FULL_GRID_DUAL_MIN_TOKENS (its straggler can cost little): the single pass
    monkeypatch.setattr(api, "FULL_GRID_DUAL_PATH", True)
    monkeypatch.setattr(api, "FULL_GRID_DUAL_MIN_TOKENS", c.block_table.shape[1] * 16 + 1)
    assert api._choose_backend("auto", None, c.q, c.k_cache, c.block_table) == ("triton", 1)
    monkeypatch.setattr(api, "FULL_GRID_DUAL_MIN_TOKENS", c.block_table.shape[1] * 16)
    assert api._choose_backend("auto", None, c.q, c.k_cache, c.block_table)[1] is api.DUAL_PATH
    # one sequence is never a full grid's dual path
    monkeypatch.setattr(api, "_num_sms", lambda dev: 1)
    one = case([300], HQ, HKV, D, 16, torch.bfloat16, device, seed=46)
    assert api._choose_backend("auto", None, one.q, one.k_cache, one.block_table)[0] == "triton_splitk"


def test_plan_reads_a_full_grid_on_the_host(device, monkeypatch):
    """plan_decode on a full grid: the single pass for even lengths, a host table for uneven ones (the host has the
    lengths); with a window (no host table) an uneven batch keeps the device's dual path."""
    monkeypatch.setattr(api, "_num_sms", lambda dev: SMS)
    even = case(BATCHES["even"], HQ, HKV, D, 16, torch.bfloat16, device, seed=47)
    plan = plan_decode(even.q, even.k_cache, even.cache_seqlens, even.block_table)
    assert (plan.backend, plan.num_splits, plan.in_order) == ("triton", 1, True), plan.reason
    uneven = case(BATCHES["straggler"], HQ, HKV, D, 16, torch.bfloat16, device, seed=48)
    plan = plan_decode(uneven.q, uneven.k_cache, uneven.cache_seqlens, uneven.block_table)
    assert plan.table is not None, plan.reason
    plan = plan_decode(uneven.q, uneven.k_cache, uneven.cache_seqlens, uneven.block_table, window_left=200)
    assert plan.backend == "triton_splitk" and plan.dual_path, plan.reason
    out, lse = decode_attention(
        *uneven.args, plan=plan, window_left=200, return_lse=True, out=torch.full_like(uneven.q, float("nan"))
    )  # fmt: skip
    ref_out, _ = reference_of(uneven, window_left=200)
    assert max_err(out, ref_out) <= output_tolerance(uneven, ref_out, torch.bfloat16, window_left=200)
