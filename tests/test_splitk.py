"""Split-K: partials against the PyTorch mirror, split-count invariance, empty splits, the combine math."""

import math

import pytest
import torch
import triton
import triton.language as tl
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
    decode_splitk,
    locate_chunk,
    plan_grid,
    slot_plan,
    split_bounds,
    splitk_partials_mirror,
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


@pytest.mark.parametrize(
    "num_sms,heads_first", [(2, True), (2, False), (64, True)], ids=["overflow", "slots-first", "wide"]
)
def test_partials_match_mirror_planned(num_sms, heads_first, device, monkeypatch):
    """Planned mode: every program derives the cut from the lengths; a long sequence among short ones gets several
    chunks (at 2 SMs some in the overflow slots), each chunk's partial matches the float64 mirror of ``slot_plan``,
    single-chunk sequences go straight to the output, in either grid order."""
    from flashdecode import triton_splitk

    monkeypatch.setattr(triton_splitk, "PARTIAL_HEADS_FIRST", heads_first)
    lens = [3, 700, 20, 0, 64]
    c = case(lens, 8, 2, 64, 16, torch.float32, device, seed=13)
    out = torch.full_like(c.q, float("nan"))
    lse = torch.empty(c.q.shape[:2], device=device)
    block_n = 32
    _, _, o_part, lse_part = decode_splitk(
        *c.args, 0.125, out, lse, num_sms=num_sms, config={"BLOCK_N": block_n}, return_partials=True
    )
    slots_per_seq, overflow_slots = plan_grid(len(lens), 2, planned_saturation(c) * num_sms)
    chunks = slot_plan(lens, slots_per_seq, overflow_slots, block_n)
    overflow = any(chunk is not None for chunk in chunks[:overflow_slots])
    assert overflow == (num_sms == 2)
    check_planned_partials(c, chunks, out, lse, o_part, lse_part, 0.125, 64)


LENGTH_SETS = ([0], [5], [131072] + [1024] * 63, [1] * 300, [7, 0, 4096, 33], [4096] * 64, [0, 0, 9000], [17] * 3)


def _random_length_sets(n=300):
    g = torch.Generator().manual_seed(5)
    for _ in range(n):
        batch = int(torch.randint(1, 40, (1,), generator=g))
        top = int(torch.randint(1, 20000, (1,), generator=g))
        lens = torch.randint(0, top, (batch,), generator=g)
        # a few very long members (the overflow's worst case) and empty ones
        lens[torch.rand(batch, generator=g) < 0.1] = top * 30
        lens[torch.rand(batch, generator=g) < 0.1] = 0
        yield lens.tolist()


def test_slot_plan_covers_every_token_within_the_grid():
    """Any lengths, heads and targets: the cut fits the grid (the overflow bound of plan_grid), covers each sequence's
    tokens once on tile edges, gives an empty sequence exactly one empty chunk, and a uniform batch no overflow slot
    and, when S divides its tiles, every one of its slots."""
    for lens in (*LENGTH_SETS, *_random_length_sets()):
        for hkv, target in ((1, 8), (8, 528), (2, 528), (12, 396), (32, 2)):
            slots_per_seq, overflow_slots = plan_grid(len(lens), hkv, target)
            plan = slot_plan(lens, slots_per_seq, overflow_slots, 64)
            assert len(plan) == overflow_slots + len(lens) * slots_per_seq, (lens, hkv, target)
            for b, n in enumerate(lens):
                mine = sorted(chunk[1:] for chunk in plan if chunk is not None and chunk[0] == b)
                # [0, n) once: contiguous chunks from 0 to n
                assert mine[0][0] == 0 and mine[-1][1] == n
                assert all(end == next_start for (_, end), (next_start, _) in zip(mine, mine[1:]))
                assert all(start % 64 == 0 and (end > start or n == 0) for start, end in mine)
                assert len(mine) >= 1 and (n > 0 or mine == [(0, 0)])
            if len(set(lens)) == 1:
                assert all(chunk is None for chunk in plan[:overflow_slots])
                if lens[0] > 0 and -(-lens[0] // 64) % slots_per_seq == 0:
                    assert all(chunk is not None for chunk in plan[overflow_slots:])


def test_planner_choices_on_the_anchor_rows():
    """The cut the H200 (132 SMs) gets on anchor rows (targets from split_config: 3 programs per SM for the MHA
    tile, 4 otherwise): the 12/12 rows 384 programs of equal chunks whatever the batch (fixed splits measured
    97.5-98.3 us there, 768 programs 100.5-103.2), a uniform batch that fills the GPU one chunk per sequence, and
    the long member of the ragged batch split while the short ones stay whole."""

    def programs(lens, hkv, block_n, per_sm):
        plan = [chunk for chunk in slot_plan(lens, *plan_grid(len(lens), hkv, per_sm * 132), block_n) if chunk]
        return hkv * len(plan), sorted({end - start for _, start, end in plan})

    for lens in ([4096] * 16, [16384] * 4, [65536]):
        assert programs(lens, 12, 128, 3) == (384, [2048])
    assert programs([131072], 12, 128, 3) == (384, [4096])
    assert programs([4096] * 64, 8, 32, 4) == (512, [4096])
    assert programs([2048] * 8, 4, 32, 4) == (512, [128])
    assert programs([1024] * 64, 2, 32, 4) == (512, [256])
    assert programs([8192], 32, 64, 4) == (512, [512])
    ragged = slot_plan([131072] + [1024] * 63, *plan_grid(64, 8, 528), 32)
    per_seq = [sum(1 for chunk in ragged if chunk and chunk[0] == b) for b in range(64)]
    assert per_seq[0] >= 16 and set(per_seq[1:]) == {1}


def test_split_bounds_cover_sequence_on_tile_edges():
    for seqlen in [0, 1, 15, 16, 17, 100, 1000]:
        for splits in [1, 2, 3, 7, 64]:
            bounds = split_bounds(seqlen, splits, 16)
            assert len(bounds) == splits
            covered = [t for start, end in bounds for t in range(start, end)]
            assert covered == list(range(seqlen))
            assert all(start % 16 == 0 for start, end in bounds if end > start)


def test_plan_grid_sized_from_batch_and_sms():
    """S = floor(target / (B * Hkv)) slots per sequence (at least 1), and one overflow program per OVERFLOW_RATIO
    regular ones (none for a single sequence)."""
    assert plan_grid(batch=4, num_kv_heads=8, target=528) == (16, 16)
    assert plan_grid(batch=1, num_kv_heads=2, target=528) == (264, 0)
    assert plan_grid(batch=600, num_kv_heads=8, target=528) == (1, 150)


def test_auto_rule(device, monkeypatch):
    """auto plans split-K for long sequences, and runs single-pass when no sequence can exceed 256 tokens or when
    B * Hkv alone gives every SM SATURATION_PER_SM programs."""
    import flashdecode.api as api
    from flashdecode.triton_splitk import SATURATION_PER_SM

    calls = []
    monkeypatch.setattr(api, "_num_sms", lambda dev: 2)
    for name in ("triton", "triton_splitk"):
        real = api._BACKEND_FNS[name]
        monkeypatch.setitem(api._BACKEND_FNS, name, lambda *a, _n=name, _r=real: (calls.append((_n, a[-1])), _r(*a)))
    long_one = case([300], 4, 1, 64, 16, torch.float16, device)
    short = case([20] * 3, 4, 1, 64, 16, torch.float16, device)
    full = case([300] * (2 * SATURATION_PER_SM), 4, 1, 64, 16, torch.float16, device)
    for c in (long_one, short, full):
        decode_attention(*c.args)
    assert calls == [("triton_splitk", None), ("triton", 1), ("triton", 1)]


def test_auto_planner_reads_no_values():
    """The split choice uses shapes only: it runs on meta tensors, which have no values to read."""
    from flashdecode.api import _choose_backend

    q = torch.empty(2, 8, 128, device="meta", dtype=torch.bfloat16)
    k = torch.empty(100, 16, 2, 128, device="meta", dtype=torch.bfloat16)
    table = torch.empty(2, 50, device="meta", dtype=torch.int32)
    name, splits = _choose_backend("auto", None, q, k, table)
    assert name in ("triton", "triton_splitk", "torch_sdpa")


def _published_combine(acc_unnormalised, m, l):
    """The seed blog post's combine: partials stored as acc_s (unnormalised), weighted by l_s * exp(m_s - M)."""
    big_m = m.max()
    w = l * torch.exp(m - big_m)
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
    acc, m, l, o, lse = [], [], [], [], []
    for chunk in range(3):
        sc, vc = s[16 * chunk : 16 * chunk + 16], v[16 * chunk : 16 * chunk + 16]
        m_s = sc.max()
        p = torch.exp(sc - m_s)
        acc.append(p @ vc), m.append(m_s), l.append(p.sum())
        o.append(acc[-1] / l[-1]), lse.append(m_s + torch.log(l[-1]))
    acc, m, l, o, lse = map(torch.stack, (acc, m, l, o, lse))
    ours = _correct_combine(o, lse)
    assert (ours - exact).abs().max() < 1e-12
    published = _published_combine(acc, m, l)
    rel = (published - exact).norm() / exact.norm()
    assert rel > 0.1, f"the published combine should be far off, got relative error {rel:.3g}"
    assert not math.isclose(float(rel), 0.0)


@pytest.mark.parametrize("block_s,d_blocks,rows", [(64, 2, 1), (256, 4, 1), (16, 8, 4), (2, 1, 8)])
def test_combine_block_shapes(block_s, d_blocks, rows, device, monkeypatch):
    """The combine with other chunk blocks (a block smaller than a sequence's chunks loops), the head dim split over
    several programs, and several query rows per program: the same merge."""
    import flashdecode.triton_splitk as splitk

    c = case([300, 0, 77, 1000], 8, 2, 64, 16, torch.float32, device, seed=31)
    ref_out, ref_lse = reference_of(c)
    monkeypatch.setattr(splitk, "COMBINE_BLOCK_S", block_s)
    monkeypatch.setattr(splitk, "COMBINE_D_BLOCKS", d_blocks)
    monkeypatch.setattr(splitk, "COMBINE_MAX_ROWS", rows)
    for num_splits in (None, 3, 40):
        out, lse = decode_attention(*c.args, backend="triton_splitk", num_splits=num_splits, return_lse=True,
                                    out=torch.full_like(c.q, float("nan")))  # fmt: skip
        assert max_err(out, ref_out) <= output_tolerance(c, ref_out, torch.float32), num_splits
        assert lse_err(lse, ref_lse) <= lse_tolerance(c, ref_lse), num_splits


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


def test_planned_cut_with_query_tokens_head_blocks_and_sinks(device, monkeypatch):
    """The planned cut on ragged lengths with an empty sequence, two query tokens, 80 rows per KV head (two head
    blocks), sinks and the LSE, NaN-filled outputs: matches the float64 reference; the 300-token and 130-token
    sequences are merged by the one combine launch, the empty one gets zeros and the sink's LSE."""
    from feature_helpers import check
    from test_multitoken import multi_case

    from flashdecode import triton_splitk
    from flashdecode.api import _num_sms

    launched = []
    real = triton_splitk.launch_combine
    monkeypatch.setattr(triton_splitk, "launch_combine", lambda *a, **k: launched.append(1) or real(*a, **k))
    lens = [300, 0, 37, 130]
    args = multi_case(lens, 2, 40, 1, 64, 16, torch.float32, device, seed=61)
    cfg, per_sm = triton_splitk.split_config(64, 40, torch.float32, 2, 4, 1)
    plan = slot_plan(lens, *plan_grid(4, 1, per_sm * _num_sms(args[0].device)), cfg["BLOCK_N"], q_len=2)
    assert [sum(1 for chunk in plan if chunk and chunk[0] == b) for b in range(4)] == [5, 1, 1, 3]
    sinks = torch.linspace(-1.0, 2.0, 40, device=device)
    out, lse = check(args, "triton_splitk", None, sinks=sinks)
    assert len(launched) == 1
    assert torch.equal(out[1].cpu(), torch.zeros_like(out[1].cpu()))
    assert torch.allclose(lse[1].cpu(), sinks.cpu().expand(2, -1))


@triton.jit
def _cut_kernel(SEQLENS, CHUNKS, CUT, batch, slots_per_seq, overflow_slots, programs, window,
                BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """CUT [3, programs] = (sequence, start, end) of every program's chunk, as the partial programs find them
    (``locate_chunk``); programs with no chunk keep the caller's sentinel."""
    slot = tl.program_id(0)
    seq, _, start, end, _ = locate_chunk(
        SEQLENS, CHUNKS, 1, slot, True, batch, slots_per_seq, overflow_slots, window, 0, BLOCK_N, 0, BLOCK_B,
        HAS_WINDOW, 1,
    )  # fmt: skip
    if seq < batch:
        tl.store(CUT + slot, seq)
        tl.store(CUT + programs + slot, start)
        tl.store(CUT + 2 * programs + slot, end)


@pytest.mark.parametrize("batch,window", [(1, None), (9, None), (40, 7000), (300, None)], ids=lambda v: str(v))
def test_in_kernel_cut_equals_the_mirror(batch, window, device):
    """The partial programs (the overflow ones first, then the regular slots) cut exactly as ``slot_plan``, program
    by program, and the chunk-0 programs publish each sequence's (chunk count, first overflow chunk) for the
    combine."""
    g = torch.Generator().manual_seed(batch)
    lens = torch.randint(0, 3000, (batch,), generator=g)
    lens[0] = 0
    if batch > 1:
        lens[1] = 200000
    block_n = 64
    slots_per_seq, overflow_slots = plan_grid(batch, 2, 64)
    programs = overflow_slots + batch * slots_per_seq
    cut = torch.full((3, programs), batch, dtype=torch.int32, device=device)
    chunks = torch.empty(2, batch, dtype=torch.int32, device=device)
    _cut_kernel[(programs,)](
        lens.to(torch.int32).to(device), chunks, cut, batch, slots_per_seq, overflow_slots, programs, window or 0,
        BLOCK_B=triton.next_power_of_2(batch), BLOCK_N=block_n, HAS_WINDOW=window is not None,
    )  # fmt: skip
    expect = slot_plan(lens.tolist(), slots_per_seq, overflow_slots, block_n, window_left=window)
    cut = cut.cpu()
    got = [tuple(cut[:, i].tolist()) if cut[0, i] < batch else None for i in range(programs)]
    assert got == expect
    counts = [sum(1 for chunk in expect if chunk and chunk[0] == b) for b in range(batch)]
    extra = [max(n - slots_per_seq, 0) for n in counts]
    assert chunks[0].tolist() == counts and chunks[1].tolist() == [sum(extra[:b]) for b in range(batch)]
    assert batch == 1 or any(extra), "the case must use overflow chunks"
