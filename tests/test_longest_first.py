"""Longest-first dispatch in the single pass (``triton_common.longest_first``): grid slot i takes the sequence a
counting sort of the visible lengths puts there, an even batch keeps its order, and the output does not depend on
the order. ``longest_first_order`` is the host mirror the slot kernel is checked against."""

import random

import pytest
import torch
import triton
import triton.language as tl
from helpers import case, max_err, output_tolerance, reference_of

from flashdecode import plan_decode
from flashdecode.triton_common import Features, even_lengths, longest_first, longest_first_order, next_power_of_2
from flashdecode.triton_single import decode_single


@triton.jit
def _slots_kernel(
    SEQLENS, SEQ, LEN, OURS, batch, window, BLOCK_B: tl.constexpr, HAS_WINDOW: tl.constexpr, SPAN: tl.constexpr
):  # fmt: skip
    slot = tl.program_id(0)
    seq, seqlen, ours = longest_first(SEQLENS, 1, batch, slot, window, BLOCK_B, HAS_WINDOW, 1, SPAN)
    tl.store(SEQ + slot, seq)
    tl.store(LEN + slot, seqlen)
    tl.store(OURS + slot, ours.to(tl.int32))


def _slots(lens, window, device, span=0):
    """(sequence, length) of every grid slot, from the device; with span > 0 (a full grid's dual path) also whether
    each slot's program runs: (sequences, lengths, ours)."""
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    seq = torch.full((len(lens),), -1, dtype=torch.int32, device=device)
    length, ours = torch.full_like(seq, -1), torch.full_like(seq, -1)
    _slots_kernel[(len(lens),)](
        seqlens, seq, length, ours, len(lens), -1 if window is None else window, next_power_of_2(len(lens)),
        window is not None, span,
    )  # fmt: skip
    if span:
        return seq.tolist(), length.tolist(), ours.tolist()
    assert ours.tolist() == [1] * len(lens)
    return seq.tolist(), length.tolist()


@pytest.mark.parametrize(
    "lens, window, expected",
    [
        ([5, 300, 40, 300, 0, 1000, 7], None, [5, 1, 3, 2, 0, 4, 6]),
        # within longest / 32 of each other: batch order
        ([990, 1000, 5, 995, 3, 2], None, [0, 1, 3, 2, 4, 5]),
        # even (the longest at most 1.5 times the mean): batch order
        ([100, 120, 90, 140], None, [0, 1, 2, 3]),
        # the visible lengths decide: 101 tokens each under a 100-token window (even), uneven without it
        ([900, 300, 5000], 100, [0, 1, 2]),
        ([900, 300, 5000], None, [2, 0, 1]),
        ([0, 0, 0], None, [0, 1, 2]),
    ],
)
def test_slots_take_the_sequences_longest_first(lens, window, expected, device):
    assert longest_first_order(lens, window) == expected
    seq, length = _slots(lens, window, device)
    assert seq == expected
    assert length == [lens[b] for b in expected]


@pytest.mark.parametrize("batch", [2, 13, 64, 300])
def test_slots_form_a_permutation_in_bucket_order(batch, device):
    g = random.Random(batch)
    lens = [g.choice([0, g.randint(1, 40), g.randint(1000, 9000)]) for _ in range(batch)]
    lens[0] = 9000  # uneven whatever was drawn
    seq, length = _slots(lens, None, device)
    assert seq == longest_first_order(lens) and sorted(seq) == list(range(batch))
    assert length == [lens[b] for b in seq]
    # non-increasing up to one bucket (longest / 32)
    assert all(length[i] >= length[j] - 9000 // 32 for i in range(batch) for j in range(i + 1, batch))
    assert not even_lengths(lens)


@pytest.mark.parametrize("window", [None, 60])
def test_single_pass_output_does_not_depend_on_the_order(window, device):
    # 12 sequences x 2 KV heads: 24 programs on 4 SMs, an uneven batch with an empty sequence (pages shuffled, unused
    # ones NaN)
    lens = [3, 150, 0, 17, 96, 1, 33, 150, 64, 5, 129, 40]
    assert not even_lengths(lens) and longest_first_order(lens) != list(range(len(lens)))
    c = case(lens, 8, 2, 64, 16, torch.float16, device, seed=5)
    features = Features(window_left=window)
    ref, _ = reference_of(c, window_left=window)
    outs = []
    for ordered in (True, False):
        out = torch.full_like(c.q, float("nan"))
        lse = torch.full(c.q.shape[:-1], float("nan"), device=device)
        decode_single(*c.args, 0.125, out, lse, features=features, num_sms=4, longest_first=ordered)
        outs.append((out, lse))
    tolerance = output_tolerance(c, ref, torch.float16, window_left=window)
    assert max_err(outs[0][0], ref) <= tolerance
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_a_plan_keeps_the_order_only_for_lengths_it_read_even(device):
    def plan_of(lens, window=None):
        c = case(lens, 8, 2, 64, 16, torch.float16, device)
        return plan_decode(c.q, c.k_cache, c.cache_seqlens, c.block_table, window_left=window)

    even = plan_of([100, 90, 120, 100])
    assert (even.backend, even.num_splits, even.in_order) == ("triton", 1, True)
    # a window keeps the shapes' single pass for uneven visible lengths: ordered on the device
    uneven = plan_of([200, 10, 30, 250], window=100)
    assert (uneven.backend, uneven.num_splits, uneven.in_order) == ("triton", 1, False)
