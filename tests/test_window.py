"""Sliding window (window_left W: the query at position p sees p - W .. p): against the reference, pages before the
window never read (they are NaN here), and the planner cuts only the visible tokens."""

import pytest
import torch
from feature_helpers import RUN_IDS, RUNS, check
from helpers import case, lse_err, max_err, planned_saturation

from flashdecode import decode_attention
from flashdecode.reference import reference_dense
from flashdecode.triton_splitk import (
    chunk_plan,
    decode_splitk,
    grid_chunks,
    num_candidates,
    splitk_partials_mirror,
    visible_start,
)


def poison_before_window(c, window_left, q_len=1):
    """NaN every cached token before each sequence's first visible one (in place): a kernel that reads any of
    them, even masked by a -inf score, gives NaN (0 x NaN)."""
    page = c.k_cache.shape[1]
    for b, n in enumerate(c.cache_seqlens.tolist()):
        for t in range(visible_start(n, window_left, q_len)):
            p = int(c.block_table[b, t // page])
            c.k_cache[p, t % page] = float("nan")
            c.v_cache[p, t % page] = float("nan")


@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("window_left", [0, 20])
def test_window_matches_reference_without_reading_earlier_tokens(window_left, backend, num_splits, device):
    # page 16, W = 20: the window of the 150-token sequence starts at token 129, row 1 of its 9th page
    lens = [0, 1, 20, 21, 22, 70, 150]
    clean = case(lens, 8, 2, 64, 16, torch.bfloat16, device, seed=31)
    expected, expected_lse = check(clean.args, backend, num_splits, window_left=window_left)
    # the same inputs with every token before the window NaN: bit-identical, so none of them was read
    c = case(lens, 8, 2, 64, 16, torch.bfloat16, device, seed=31)
    poison_before_window(c, window_left)
    out, lse = decode_attention(*c.args, backend=backend, num_splits=num_splits, return_lse=True, window_left=window_left)
    assert torch.equal(out, expected) and lse_err(lse, expected_lse) == 0.0


def test_window_covering_everything_is_full_attention(device):
    c = case([1, 30, 64], 8, 2, 64, 16, torch.bfloat16, device, seed=32)
    for backend, num_splits in RUNS:
        full = decode_attention(*c.args, backend=backend, num_splits=num_splits)
        windowed = decode_attention(*c.args, backend=backend, num_splits=num_splits, window_left=64)
        off = decode_attention(*c.args, backend=backend, num_splits=num_splits, window_left=-1)
        assert torch.equal(full, windowed) and torch.equal(full, off), backend


def test_planner_cuts_only_the_window():
    """32k tokens with W = 4096: the planned chunks cover exactly the last 4097 tokens (4096 tokens' work, not
    32k), and the same for every sequence of a ragged batch."""
    lens = [32768, 100, 5000]
    plan = chunk_plan(lens, 8, 132, 1000, 64, num_candidates(32768, 64), window_left=4096)
    for b, n in enumerate(lens):
        mine = sorted((s, e) for sb, s, e in plan if sb == b)
        assert mine[0][0] == max(n - 1 - 4096, 0) and mine[-1][1] == n
        assert all(e0 == s1 for (_, e0), (s1, _) in zip(mine, mine[1:]))
    assert sum(e - s for _, s, e in plan) == 4097 + 100 + 4097


def test_planned_window_partials_match_mirror(device):
    """The planner kernel's chunks with a window (small tiles, few SMs, so the long sequence gets several chunks)
    hold the partials of exactly the visible ranges."""
    lens = [300, 40, 0]
    c = case(lens, 4, 2, 64, 16, torch.float32, device, seed=33)
    window, block_n, num_sms = 100, 16, 4
    out = torch.full_like(c.q, float("nan"))
    lse = torch.empty(c.q.shape[:2], device=device)
    _, _, o_part, lse_part = decode_splitk(
        *c.args, 0.125, out, lse, num_sms=num_sms, config={"BLOCK_N": block_n}, return_partials=True,
        features=_window_features(window),
    )  # fmt: skip
    num_cand = num_candidates(c.block_table.shape[1] * 16, block_n)
    chunks = chunk_plan(lens, 2, num_sms, grid_chunks(3, 2, num_sms), block_n, num_cand, window,
                        saturation=planned_saturation(c))  # fmt: skip
    assert sum(1 for b, _, _ in chunks if b == 0) > 1 and chunks[0][1] == 300 - 1 - window
    ref_o, ref_lse = splitk_partials_mirror(*c.args, 0.125, chunks)
    multi = torch.tensor([b == 0 for b, _, _ in chunks])
    assert lse_err(lse_part[: len(chunks)][multi], ref_lse[multi]) <= 1e-5
    assert max_err(o_part[: len(chunks)][multi][..., :64], ref_o[multi]) <= 1e-5
    ref_out, ref_lse_all = reference_dense(*c.args, 0.125, window_left=window)
    assert max_err(out, ref_out) <= 1e-5 and lse_err(lse, ref_lse_all) <= 1e-5


def _window_features(window):
    from flashdecode.triton_common import Features

    return Features(window_left=window)
