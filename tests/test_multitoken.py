"""Multi-token queries (speculative verification): q [B, q_len, Hq, D], the cache already holding the q_len new
tokens, token i seeing cache positions < L - q_len + i + 1."""

import pytest
import torch
from feature_helpers import RUN_IDS, RUNS, check
from helpers import case, max_err

from flashdecode import decode_attention
from flashdecode.check import output_tolerance
from flashdecode.reference import reference_dense
from flashdecode.triton_common import Features
from flashdecode.triton_splitk import decode_splitk


def multi_case(lens, q_len, hq, hkv, d, page, dtype, device, seed):
    c = case(lens, hq, hkv, d, page, dtype, device, seed=seed)
    g = torch.Generator(device=device).manual_seed(seed + 1)
    q = torch.randn(len(lens), q_len, hq, d, generator=g, device=device).to(dtype)
    return (q,) + c.args[1:]


@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("q_len,hq,hkv", [(2, 8, 2), (5, 6, 2), (8, 8, 2)], ids=["T2-G4", "T5-G3", "T8-G4"])
def test_multi_token_matches_reference(q_len, hq, hkv, backend, num_splits, device):
    # lengths below q_len: the first tokens see nothing (out 0, lse -inf), like an empty sequence
    args = multi_case([0, 1, 3, 45], q_len, hq, hkv, 64, 16, torch.bfloat16, device, seed=40 + q_len)
    out, lse = check(args, backend, num_splits)
    assert torch.isneginf(lse[0]).all() and torch.isneginf(lse[1, : q_len - 1]).all()
    assert torch.equal(out[0].cpu(), torch.zeros_like(out[0].cpu()))


def test_token_i_equals_a_single_token_call_on_a_shorter_cache(device):
    """Independent of the reference: token i of a q_len call is the q_len = 1 answer for length L - q_len + i + 1."""
    q_len = 4
    args = multi_case([7, 40, 90], q_len, 8, 2, 64, 16, torch.float32, device, seed=44)
    q, k, v, lens, table = args
    for backend, num_splits in RUNS:
        out = decode_attention(*args, backend=backend, num_splits=num_splits)
        for i in range(q_len):
            shorter = lens - q_len + i + 1
            one = decode_attention(q[:, i], k, v, shorter, table, backend=backend, num_splits=num_splits)
            assert max_err(out[:, i], one) <= 1e-5, (backend, i)


@pytest.mark.parametrize("num_splits", [None, 3], ids=["planned", "splits3"])
def test_multi_token_with_every_feature_edges_inside_a_split(num_splits, device):
    """q_len 4, W = 40, 16-token tiles, 3 splits: the visible range [106, 150) of the 150-token sequence splits at
    122 and 138; the last token's window starts at 109 (inside split 0), the first token's causal end 147 lies
    inside split 2; softcap, ALiBi and sinks on top."""
    q_len, window = 4, 40
    args = multi_case([150, 2, 41], q_len, 6, 2, 64, 16, torch.float32, device, seed=45)
    g = torch.Generator().manual_seed(3)
    slopes, sinks = (torch.rand(6, generator=g) * 0.2).to(device), torch.randn(6, generator=g).to(device)
    kw = dict(softcap=8.0, alibi_slopes=slopes, sinks=sinks, window_left=window)
    ref_out, ref_lse = reference_dense(*args, **kw)
    features = Features(softcap=8.0, alibi_slopes=slopes, sinks=sinks, window_left=window, q_len=q_len)
    out = torch.full_like(args[0], float("nan"))
    lse = torch.empty(args[0].shape[:-1], device=device)
    decode_splitk(
        *args, 64**-0.5, out, lse, num_splits=num_splits, num_sms=4, config={"BLOCK_N": 16}, features=features
    )  # fmt: skip
    assert max_err(out, ref_out) <= output_tolerance(args, ref_out, **kw)
    assert max_err(lse, ref_lse) <= 1e-5


@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
def test_multi_token_large_group_head_blocks(backend, num_splits, device):
    """q_len 8 x group 16 = 128 rows: two head blocks of 64 rows, tokens split across them."""
    args = multi_case([9, 30], 8, 16, 1, 64, 16, torch.bfloat16, device, seed=46)
    check(args, backend, num_splits)
