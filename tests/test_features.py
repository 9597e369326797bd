"""Model features against the float64 reference: head dims, page sizes, large GQA groups, softcap, ALiBi, sinks.

Every kernel result is compared with ``reference_dense`` (float64, features written out plainly) within 2 x the
error of ``torch_naive`` doing the same math in the input dtype + 1 ulp (``check.output_tolerance``); LSEs within
2 x the error of the same math in fp32 + 4 fp32 ulps. Unused pages are NaN, output buffers start as NaN.
"""

import math

import pytest
import torch
import triton
import triton.language as tl
from feature_helpers import RUN_IDS, RUNS, check
from helpers import case, max_err

from flashdecode import decode_attention
from flashdecode.triton_common import launch_config, softcap_logits

# (head_dim, page_size, Hq, Hkv, lengths): every head dim, page sizes 1..528 incl. non-powers of two, groups 1..128
GEOMETRIES = [
    pytest.param(64, 1, 4, 4, [0, 1, 9, 37], id="D64-P1-G1"),
    pytest.param(80, 5, 6, 2, [0, 4, 5, 6, 33], id="D80-P5-G3"),
    pytest.param(96, 17, 16, 2, [1, 16, 17, 18, 52], id="D96-P17-G8"),
    pytest.param(128, 16, 12, 1, [0, 15, 16, 40], id="D128-P16-G12"),
    pytest.param(192, 528, 8, 2, [1, 527, 530], id="D192-P528-G4"),
    pytest.param(256, 16, 14, 2, [0, 3, 17, 40], id="D256-P16-G7"),
    pytest.param(64, 16, 128, 1, [0, 33], id="D64-P16-G128"),
    pytest.param(256, 5, 64, 1, [2, 11], id="D256-P5-G64"),
]


@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("d,page,hq,hkv,lens", GEOMETRIES)
def test_geometry(d, page, hq, hkv, lens, backend, num_splits, device):
    c = case(lens, hq, hkv, d, page, torch.bfloat16, device, seed=d + page + hq)
    check(c.args, backend, num_splits)


def test_large_groups_use_head_blocks():
    """128 query heads on one KV head do not fit one tile: the rows are cut into head blocks of <= 64 (32 at
    head_dim 256) so the q tile and accumulator stay in registers; shared memory stays in its budget."""
    from flashdecode.triton_common import SMEM_BUDGET

    for d, group, q_len, block_h in ((64, 128, 1, 64), (128, 128, 1, 64), (256, 64, 1, 32), (128, 16, 8, 64)):
        cfg = launch_config(d, group, torch.bfloat16, q_len)
        assert cfg["BLOCK_H"] == block_h and math.ceil(q_len * group / block_h) > 1, (d, group, cfg)
    for d in (64, 128, 256):
        for group in (1, 4, 128):
            for dtype in (torch.float32, torch.bfloat16):
                cfg = launch_config(d, group, dtype)
                smem = cfg["BLOCK_N"] * cfg["BLOCK_D"] * cfg["num_stages"] * 2 * dtype.itemsize
                assert smem <= SMEM_BUDGET, (d, group, dtype, cfg)
    # the measured bf16 head_dim-128 configs: MHA 128-token tiles; GQA groups of 4-16 the prefetching 32-token
    # tile, and 64-token tiles in every unmeasured case
    assert launch_config(128, 1, torch.bfloat16)["BLOCK_N"] == 128
    # head dims 64 and 256 (HEAD_DIM_TILES): 128-token tiles at 2 stages; 64-token tiles, 8 warps, 2 stages
    for d, expect in ((64, (128, 2, 4)), (256, (64, 2, 8))):
        for dtype in (torch.bfloat16, torch.float16):
            cfg = launch_config(d, 4, dtype)
            assert (cfg["BLOCK_N"], cfg["num_stages"], cfg["num_warps"], cfg["PREFETCH_PAGES"]) == (*expect, False)
    # ...and the single pass at head_dim 256 (SINGLE_PASS_HEAD_DIM_TILES): 3 stages with the page ids a tile ahead
    deep = launch_config(256, 4, torch.bfloat16, single=True)
    assert (deep["BLOCK_N"], deep["num_stages"], deep["num_warps"], deep["PREFETCH_PAGES"]) == (64, 3, 8, True)
    # the prefetching 32-token tile in a 16-bit cache; an fp8 cache's split-K calls (kv_itemsize 1, short chunks
    # possible) take 64-token prefetching tiles capped at 128 registers (FP8_SPLIT_TILE)
    short = launch_config(128, 8, torch.bfloat16)
    assert (short["BLOCK_N"], short["num_stages"], short["PREFETCH_PAGES"]) == (32, 3, True)
    fp8_split = launch_config(128, 8, torch.float16, 1, 1)
    assert (fp8_split["BLOCK_N"], fp8_split["num_stages"], fp8_split["PREFETCH_PAGES"], fp8_split["maxnreg"]) == (
        64, 3, True, 128)  # fmt: skip
    # an fp8 cache's single pass and long chunks: FP8_LONG_TILE
    fp8_single = launch_config(128, 8, torch.bfloat16, 1, 1, single=True)
    for long in (fp8_single, launch_config(128, 4, torch.float16, 1, 1, prefetch=False)):
        assert (long["BLOCK_N"], long["num_stages"], long["PREFETCH_PAGES"]) == (128, 3, True)
    # ...and without the prefetching tile a 16-bit cache's the plain 64-token one
    plain = launch_config(128, 8, torch.bfloat16, prefetch=False)
    assert (plain["BLOCK_N"], plain["num_stages"], plain["PREFETCH_PAGES"]) == (64, 3, False)
    for cfg in (launch_config(256, 8, torch.float16, 1, 1),
                launch_config(128, 8, torch.bfloat16, 2), launch_config(64, 8, torch.bfloat16),
                launch_config(128, 2, torch.bfloat16), launch_config(128, 32, torch.bfloat16)):
        assert not cfg["PREFETCH_PAGES"] and cfg["BLOCK_N"] in (32, 64, 128), cfg


def _heads(hq, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(hq, generator=g), torch.randn(hq, generator=g) * 2


@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
def test_softcap(backend, num_splits, device):
    c = case([0, 1, 16, 70], 8, 2, 64, 16, torch.bfloat16, device, seed=21)
    check(c.args, backend, num_splits, softcap=5.0)


@triton.jit
def _softcap_kernel(S, OUT, softcap, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(OUT + offs, softcap_logits(tl.load(S + offs), softcap))


def _softcap(s, softcap):
    out = torch.empty_like(s)
    _softcap_kernel[(1,)](s, out, softcap, N=s.numel())
    return out


@pytest.mark.parametrize("softcap", [1.0, 50.0])
def test_softcap_logits_within_a_few_ulps(softcap, device):
    """The kernels' softcap * tanh(s / softcap) on fp32 logits from 1e-30 to 1e4 times the cap, both signs, against
    float64: within 6 fp32 ulps relative (tanh within 5 with the GPU's approximate exp2, the division and the
    product half an ulp each), and 0 at 0. (1 - e) / (1 + e) alone cancelled for small |s / softcap|: 0 below
    3e-8, 1.3% off at 1e-6 (1e5 ulps), an fp32 case over its tolerance in the fuzzer (test_fuzz.FOUND)."""
    mag = torch.logspace(-30, 4, 2048, dtype=torch.float64) * softcap
    s = torch.cat([mag, -mag]).float()
    want = softcap * torch.tanh(s.double() / softcap)
    rel = (_softcap(s.to(device), softcap).cpu().double() - want).abs() / want.abs()
    assert float(rel.max()) <= 6 * torch.finfo(torch.float32).eps, f"worst at s = {float(s[rel.argmax()]):.3g}"
    assert float(_softcap(torch.zeros(16, device=device), softcap).abs().max()) == 0.0


@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
def test_softcap_huge_logits_stay_finite(backend, num_splits, device):
    """Logits of a few hundred (q scaled up) over softcap 2: exp(2 logit / softcap) would overflow fp32; tanh
    saturates to +-softcap instead, no NaN / inf."""
    c = case([3, 40], 8, 2, 64, 16, torch.float16, device, seed=22)
    q = c.q * 300
    args = (q,) + c.args[1:]
    out, lse = check(args, backend, num_splits, softcap=2.0)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    # without the cap the same logits overflow nothing either, but the answer differs: the cap is applied
    plain = decode_attention(*args, backend=backend, num_splits=num_splits)
    assert max_err(plain, out) > 0.1


@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
def test_alibi(backend, num_splits, device):
    c = case([0, 1, 16, 70], 8, 2, 64, 16, torch.bfloat16, device, seed=23)
    slopes, _ = _heads(8, 1)
    check(c.args, backend, num_splits, alibi_slopes=slopes.to(device))


@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
def test_sinks(backend, num_splits, device):
    c = case([0, 1, 16, 70], 8, 2, 64, 16, torch.bfloat16, device, seed=24)
    _, sinks = _heads(8, 2)
    out, lse = check(c.args, backend, num_splits, sinks=sinks.to(device))
    # an empty sequence: out = 0 and lse = the sink
    assert torch.equal(out[0].cpu(), torch.zeros_like(out[0].cpu()))
    assert torch.allclose(lse[0].cpu(), sinks)


def test_sink_counted_once_with_splits(device):
    """With S splits a sink counted per split would add S exp(sink) to the denominator; counted once, the LSE is
    exactly logaddexp(lse without sink, sink) and the output is scaled by exp(lse_plain - lse)."""
    c = case([300, 130], 4, 2, 64, 16, torch.float32, device, seed=25)
    sinks = torch.full((4,), 3.0, device=device)
    plain_out, plain_lse = decode_attention(*c.args, backend="triton_splitk", num_splits=8, return_lse=True)
    out, lse = decode_attention(*c.args, backend="triton_splitk", num_splits=8, return_lse=True, sinks=sinks)
    expect_lse = torch.logaddexp(plain_lse, sinks[None])
    assert torch.allclose(lse, expect_lse, atol=1e-5)
    assert torch.allclose(out, plain_out * torch.exp(plain_lse - expect_lse)[..., None], atol=1e-5)


@pytest.mark.parametrize("backend,num_splits", RUNS, ids=RUN_IDS)
def test_features_together(backend, num_splits, device):
    c = case([0, 1, 17, 64, 100], 12, 4, 96, 17, torch.float16, device, seed=26)
    slopes, sinks = _heads(12, 3)
    check(c.args, backend, num_splits, softcap=4.0, alibi_slopes=slopes.to(device), sinks=sinks.to(device))
