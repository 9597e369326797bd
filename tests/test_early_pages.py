"""The first page ids loaded before the lengths (``triton_common.EARLY_PAGES``): the single pass from token 0 and
fixed splits from where a plan's length puts them, masked by the table's width alone, then loaded again wherever the
range starts elsewhere. With the switch on or off every output must be the same bits: the page ids a kernel uses
never change, only when their load issues. The cases have ragged lengths (0, 1, page - 1, page, page + 1, longer),
shuffled pages, NaN spare pages, and -1 or out-of-range garbage past every sequence in tables wider than it.
"""

import pytest
import torch
from helpers import case, lse_err, lse_tolerance, max_err, output_tolerance, reference_of

from flashdecode import api, decode_attention, plan_decode, triton_common, triton_single, triton_splitk
from flashdecode.triton_single import decode_single
from flashdecode.triton_splitk import decode_splitk

# 8 query heads over 2 KV heads at head dim 128, 16-bit cache: the page-id prefetching tile (32 or 64 tokens)
LENS = [0, 1, 15, 16, 17, 70]


def _case(lens, device, dtype=torch.bfloat16, seed=1, extra_table_columns=5):
    return case(lens, 8, 2, 128, 16, dtype, device, seed=seed, extra_table_columns=extra_table_columns)


def _launched(monkeypatch, module, kernel):
    """A list that gets the EARLY_PAGES constexpr of every launch of `kernel` from now on."""
    seen, launch = [], module.launch

    def noting(k, grid, *a, **kw):
        if k is kernel:
            seen.append(kw["EARLY_PAGES"])
        return launch(k, grid, *a, **kw)

    monkeypatch.setattr(module, "launch", noting)
    return seen


def _both(monkeypatch, run):
    """run() with the switch off, then on: ((out, lse) off, (out, lse) on)."""
    results = []
    for early in (False, True):
        monkeypatch.setattr(triton_common, "EARLY_PAGES", early)
        results.append(run())
    return results


def _nan_like(c):
    return torch.full_like(c.q, float("nan")), torch.full(c.q.shape[:-1], float("nan"), device=c.q.device)


def _check(c, out, lse):
    ref_out, ref_lse = reference_of(c)
    assert max_err(out, ref_out) <= output_tolerance(c, ref_out, c.q.dtype)
    assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_single_pass_loads_first_pages_before_lengths(dtype, device, monkeypatch):
    c = _case(LENS, device, dtype)
    seen = _launched(monkeypatch, triton_single, triton_single._decode_single_kernel)
    scale = c.q.shape[-1] ** -0.5

    def run():
        out, lse = _nan_like(c)
        return decode_single(*c.args, scale, out, lse, num_sms=4)

    (out_off, lse_off), (out_on, lse_on) = _both(monkeypatch, run)
    assert seen == [False, True]
    assert torch.equal(out_on, out_off) and torch.equal(lse_on, lse_off)
    _check(c, out_on, lse_on)


@pytest.mark.parametrize("hint", [70, 16, 33, 1000], ids=["hint-70", "hint-16", "hint-33", "hint-past-table"])
def test_fixed_splits_load_first_pages_from_the_hint(hint, device, monkeypatch):
    """Sequences whose length is the hint take the early ids; the others (and a hint past the table) load them
    again from their own start; with the merge in the last split program (counters) and with a combine launch."""
    c = _case(LENS, device)
    seen = _launched(monkeypatch, triton_splitk, triton_splitk._partial_kernel)
    scale = c.q.shape[-1] ** -0.5
    rows = c.q.shape[0] * c.q.shape[1]
    for counters in (None, torch.zeros(rows, dtype=torch.int32, device=device)):
        seen.clear()

        def run():
            out, lse = _nan_like(c)
            return decode_splitk(*c.args, scale, out, lse, num_splits=3, num_sms=4, counters=counters, len_hint=hint)

        (out_off, lse_off), (out_on, lse_on) = _both(monkeypatch, run)
        assert seen == [False, True]
        assert torch.equal(out_on, out_off) and torch.equal(lse_on, lse_off)
        _check(c, out_on, lse_on)


def test_plan_hints_its_uniform_length(device, monkeypatch):
    """plan_decode passes the length of a uniform batch to its fixed splits (and none for uneven lengths or a
    window); the call with the plan gives the same bits as the splits without the hint, and stays right when the
    lengths change after planning."""
    # 16 SMs: the 4 single-pass programs would leave most idle, so the plan splits
    monkeypatch.setattr(api, "_num_sms", lambda dev: 16)
    c = _case([200, 200], device)
    plan = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table)
    assert plan.num_splits and plan.num_splits > 1 and plan.len_hint == 200, plan
    seen = _launched(monkeypatch, triton_splitk, triton_splitk._partial_kernel)
    out, lse = decode_attention(*c.args, plan=plan, out=_nan_like(c)[0], return_lse=True)
    assert seen == [True]
    scale = c.q.shape[-1] ** -0.5
    plain = _nan_like(c)
    counters = torch.zeros_like(plan.counters) if plan.counters is not None else None
    decode_splitk(*c.args, scale, *plain, num_splits=plan.num_splits, num_sms=16, counters=counters)
    assert torch.equal(out, plain[0]) and torch.equal(lse, plain[1])
    _check(c, out, lse)
    moved = _case([0, 185], device, seed=2, extra_table_columns=6)
    assert moved.block_table.shape == c.block_table.shape
    out, lse = decode_attention(*moved.args, plan=plan, out=_nan_like(moved)[0], return_lse=True)
    _check(moved, out, lse)
    uneven = _case([200, 150], device)
    assert plan_decode(uneven.q, uneven.k_cache, uneven.cache_seqlens, uneven.block_table).len_hint == 0
    windowed = plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table, window_left=63)
    assert windowed.len_hint == 0
