"""deterministic=True: a sequence's output is bit-identical alone or inside any batch, under the interpreter and
on the GPU (the same test runs on both)."""

import pytest
import torch
from helpers import case, max_err, output_tolerance, reference_of

import flashdecode.triton_splitk as splitk
from flashdecode import decode_attention
from flashdecode.triton_splitk import split_bounds


@pytest.fixture
def split_tokens(device, monkeypatch):
    """The split size under test: the real one on a GPU; 256 (a multiple of every BLOCK_N) under the interpreter,
    where each token costs time. The guarantee does not depend on the value."""
    if device == "cpu":
        monkeypatch.setattr(splitk, "DETERMINISTIC_SPLIT_TOKENS", 256)
    return splitk.DETERMINISTIC_SPLIT_TOKENS


def _sub_batch(c, rows, extra_columns=0):
    """Rows of a case that share its cache pool, optionally with a wider block table (-1 padded)."""
    idx = torch.tensor(rows, device=c.q.device)
    table = c.block_table[idx]
    if extra_columns:
        pad = torch.full((len(rows), extra_columns), -1, dtype=torch.int32, device=table.device)
        table = torch.cat([table, pad], dim=1)
    return c.q[idx], c.k_cache, c.v_cache, c.cache_seqlens[idx], table


@pytest.mark.parametrize("backend", ["auto", "triton_splitk", "triton"])
def test_bit_identical_in_any_batch(backend, device, split_tokens):
    # sequence 0 is watched (several splits); the others are empty, short, long
    t = split_tokens
    # fp32 output and the LSE: a different summation order shows in the last bits (bf16 rounding could hide it)
    c = case([2 * t + 113, 0, 7, t + 1, 3 * t], 4, 1, 32, 16, torch.float32, device, seed=21)
    alone, alone_lse = decode_attention(*_sub_batch(c, [0]), backend=backend, deterministic=True, return_lse=True)
    ref_out, _ = reference_of(c)
    assert max_err(alone[0], ref_out[0]) <= output_tolerance(c, ref_out, torch.float32)
    # the last batch is crowded enough that the planned (non-deterministic) cut would change for sequence 0
    crowded = [4] * 10 + [0] + [4] * 10
    for rows, extra in (([2, 3, 0, 4], 0), ([0, 0, 2], 40), (crowded, 0)):
        out, lse = decode_attention(*_sub_batch(c, rows, extra), backend=backend, deterministic=True, return_lse=True)
        for i, row in enumerate(rows):
            if row == 0:
                where = f"batch {rows} (+{extra} table columns), position {i}"
                assert torch.equal(out[i], alone[0]) and torch.equal(lse[i], alone_lse[0]), where


def test_splits_follow_the_sequence_length_only():
    """Split boundaries every DETERMINISTIC_SPLIT_TOKENS tokens, whatever the slot count (table width)."""
    t = splitk.DETERMINISTIC_SPLIT_TOKENS
    for slots in (3, 5, 9):
        bounds = [b for b in split_bounds(2 * t + 452, slots, 64, split_tokens=t) if b[0] < b[1]]
        assert bounds == [(0, t), (t, 2 * t), (2 * t, 2 * t + 452)]


def test_without_the_flag_the_cut_depends_on_the_batch():
    """Why the flag exists: the planned cut adapts to the batch, so bits may move (here it must change the cut)."""
    from flashdecode.triton_splitk import chunk_plan, grid_chunks, launch_config, num_candidates

    WATCHED = 2500
    cfg = launch_config(32, 2, torch.bfloat16)
    alone = chunk_plan([WATCHED], 2, 16, grid_chunks(1, 2, 16), cfg["BLOCK_N"], num_candidates(4096, cfg["BLOCK_N"]))
    batch = [WATCHED] + [3072] * 6
    crowded = chunk_plan(batch, 2, 16, grid_chunks(7, 2, 16), cfg["BLOCK_N"], num_candidates(4096, cfg["BLOCK_N"]))
    assert [x for x in alone if x[0] == 0] != [x for x in crowded if x[0] == 0]
