"""triton_tma (TMA page boxes, pipelined tiles, split-K planner and combine) against the float64 reference.

Without a GPU the kernel runs in the Triton interpreter, which executes tensor-descriptor loads (zero fill outside
the tensor included) but not the pipelining; ``test_compiles_to_pipelined_tma_for_sm90`` compiles the kernel for
Hopper without a GPU and checks the TMA copies and the multi-buffering in the generated code.
"""

import types

import pytest
import torch
from helpers import (
    case,
    check_planned_partials,
    lse_err,
    lse_tolerance,
    max_err,
    output_tolerance,
    ragged_lengths,
    reference_of,
)

from flashdecode import decode_attention
from flashdecode.cases import poison_page_tails
from flashdecode.triton_splitk import chunk_plan, num_candidates, split_bounds, splitk_partials_mirror
from flashdecode.triton_tma import check_supported, decode_tma, grid_slots

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# (dtype, page_size, group, head_dim): page sizes 16 and 32, groups 1, 4 and 7 (not a power of two), head dims
# 64 and 128, each dtype at least twice
GEOMETRIES = [
    ("fp32", 16, 1, 64),
    ("fp32", 32, 7, 128),
    ("fp16", 32, 4, 128),
    ("fp16", 16, 7, 64),
    ("bf16", 16, 4, 128),
    ("bf16", 32, 1, 64),
]


@pytest.mark.parametrize(
    "dname,page,group,d", [pytest.param(*g, id=f"{g[0]}-P{g[1]}-G{g[2]}-D{g[3]}") for g in GEOMETRIES]
)
def test_matches_reference(dname, page, group, d, device):
    """Ragged lengths (0, 1, page-1, page, page+1, several pages, several chunks), NaN in the unused pages and in
    the output buffer, -1 / garbage table entries past each sequence."""
    dtype = DTYPES[dname]
    hkv = 2
    c = case(ragged_lengths(page, long=5 * page + 3), group * hkv, hkv, d, page, dtype, device, seed=page + group + d)
    ref_out, ref_lse = reference_of(c)
    tol = output_tolerance(c, ref_out, dtype)
    # rows past each sequence's end inside its last page hold NaN too (as uninitialised memory may); poisoned after
    # the tolerance is measured, since the PyTorch baseline reads whole pages
    poison_page_tails(c)
    out = torch.full_like(c.q, float("nan"))
    result, lse = decode_attention(*c.args, backend="triton_tma", out=out, return_lse=True)
    assert result.data_ptr() == out.data_ptr()
    err = max_err(out, ref_out)
    assert err <= tol, f"max |out - ref| = {err:.3g} > tolerance {tol:.3g}"
    err, tol = lse_err(lse, ref_lse), lse_tolerance(c, ref_lse)
    assert err <= tol, f"max |lse - ref| = {err:.3g} > tolerance {tol:.3g}"
    # empty sequence: exact zeros and -inf
    assert torch.equal(out[0].cpu(), torch.zeros_like(out[0].cpu()))
    assert torch.isneginf(lse[0]).all()


def test_partials_match_mirror_fixed_splits(device):
    """Fixed splits on tile edges (tiles of 2 pages): each split's (o_s, lse_s) equals the float64 mirror's, empty
    splits (0, -inf) included; partial tail tiles, full tiles and tiles past the end all occur."""
    lens = [0, 5, 40, 100]
    c = case(lens, 12, 4, 64, 16, torch.float32, device, seed=12)
    num_splits, pages_per_tile = 3, 2
    block_n = pages_per_tile * 16
    out = torch.full_like(c.q, float("nan"))
    lse = torch.empty(c.q.shape[:2], device=device)
    _, _, o_part, lse_part = decode_tma(
        *c.args, 0.125, out, lse, num_splits=num_splits, config={"PAGES_PER_TILE": pages_per_tile},
        return_partials=True,
    )  # fmt: skip
    chunks = [(b, *bounds) for b, n in enumerate(lens) for bounds in split_bounds(n, num_splits, block_n)]
    ref_o, ref_lse = splitk_partials_mirror(*c.args, 0.125, chunks)
    assert torch.isneginf(ref_lse).any(), "the case must contain empty splits"
    assert lse_err(lse_part, ref_lse) <= 1e-5
    assert max_err(o_part[..., :64], ref_o) <= 1e-5
    ref_out, ref_lse_all = reference_of(c, softmax_scale=0.125)
    assert max_err(out, ref_out) <= 1e-5 and lse_err(lse, ref_lse_all) <= 1e-5


def test_partials_match_mirror_planned(device):
    """Planned mode with the TMA kernel's own programs per SM: the long sequence gets several chunks (combined),
    the short ones one each (written directly); every multi-chunk partial matches the mirror of chunk_plan."""
    lens = [3, 300, 20, 0]
    c = case(lens, 8, 2, 64, 16, torch.float32, device, seed=13)
    out = torch.full_like(c.q, float("nan"))
    lse = torch.empty(c.q.shape[:2], device=device)
    num_sms, ppsm, block_n = 4, 2, 16
    _, _, o_part, lse_part = decode_tma(
        *c.args, 0.125, out, lse, num_sms=num_sms, return_partials=True,
        config={"PAGES_PER_TILE": 1, "PROGRAMS_PER_SM": ppsm},
    )  # fmt: skip
    max_tokens = c.block_table.shape[1] * 16
    chunks = chunk_plan(
        lens, 2, num_sms, grid_slots(len(lens), 2, num_sms, ppsm), block_n, num_candidates(max_tokens, block_n),
        saturation=ppsm,
    )
    check_planned_partials(c, chunks, out, lse, o_part, lse_part, 0.125, 64)


def test_page_permutation_invariance_and_strided_cache(device):
    """Moving pages around the pool (and the table with them) changes no bit; so does reading K and V as views
    of one packed KV buffer (other strides, same TMA boxes)."""
    page = 16
    c = case([3, 50, 17, 64], 8, 2, 64, page, torch.bfloat16, device, seed=5)
    out = decode_attention(*c.args, backend="triton_tma")
    perm = torch.randperm(c.k_cache.shape[0], generator=torch.Generator().manual_seed(1)).to(device)
    inverse = torch.argsort(perm)
    table = c.block_table.clone()
    for b, n in enumerate(c.cache_seqlens.cpu().tolist()):
        used = -(-n // page)
        table[b, :used] = inverse[c.block_table[b, :used].long()].to(torch.int32)
    moved = decode_attention(c.q, c.k_cache[perm], c.v_cache[perm], c.cache_seqlens, table, backend="triton_tma")
    assert torch.equal(out, moved)
    kv = torch.stack([c.k_cache, c.v_cache], dim=2)  # [pages, page, 2, Hkv, D]
    packed = decode_attention(c.q, kv[:, :, 0], kv[:, :, 1], c.cache_seqlens, c.block_table, backend="triton_tma")
    assert torch.equal(out, packed)


@pytest.mark.parametrize("page", [8, 12, 512])
def test_page_size_outside_tma_limits_is_refused(page, device):
    c = case([5, 20], 4, 2, 64, page, torch.float16, device)
    with pytest.raises(ValueError, match=f"page_size must be a power of two in \\[16, 256\\].*got {page}"):
        decode_attention(*c.args, backend="triton_tma")


def test_misaligned_cache_is_refused(device):
    c = case([5, 20], 4, 2, 64, 16, torch.float16, device)
    # the same cache one element (2 bytes) further into a flat buffer: base address not 16-byte aligned
    flat = torch.empty(c.k_cache.numel() + 1, dtype=torch.float16, device=device)
    k = flat[1:].view(c.k_cache.shape)
    k.copy_(c.k_cache)
    with pytest.raises(ValueError, match="k_cache must have a 16-byte aligned base address"):
        decode_attention(c.q, k, c.v_cache, c.cache_seqlens, c.block_table, backend="triton_tma")


def test_pre_hopper_gpu_is_refused(monkeypatch):
    """On a CUDA device of compute capability < 9.0 the backend names the capability and the alternative."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    q = types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
    c = case([5], 4, 2, 64, 16, torch.float16, "cpu")
    with pytest.raises(ValueError, match=r"compute capability >= 9.0 .*got 8.0 \(NVIDIA A100\).*triton_splitk"):
        check_supported(q, c.k_cache, c.v_cache)


# compiled in a fresh process: under TRITON_INTERPRET=1 the kernels are interpreted functions, not compilable
_COMPILE_SM90 = """
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashdecode import triton_tma

page, group, d, stages = 16, 4, 128, 3
cfg = triton_tma.tma_config(d, group, page)
desc = f"tensordesc<bf16[1,{page},1,{cfg['BLOCK_D']}]>"
signature = dict(
    Q="*bf16", K_DESC=desc, V_DESC=desc, SEQLENS="*i32", BLOCK_TABLE="*i32", PLAN="*i32", O_PART="*fp32",
    LSE_PART="*fp32", OUT="*bf16", LSE="*fp32", qk_scale="fp32", batch="i32", max_chunks="i32", num_pages="i32",
    stride_qb="i32", stride_qh="i32", stride_sl="i32", stride_btb="i32", stride_btp="i32", stride_ob="i32",
    stride_oh="i32",
)
constexprs = dict(
    NUM_SPLITS=0, GROUP=group, HEAD_DIM=d, PAGE_SIZE=page, PAGES_PER_TILE=cfg["PAGES_PER_TILE"],
    BLOCK_H=cfg["BLOCK_H"], BLOCK_D=cfg["BLOCK_D"], DOT_F32=False, WRITE_LSE=True,
)
signature.update({name: "constexpr" for name in constexprs})
src = ASTSource(triton_tma._tma_partial_kernel, signature, constexprs=constexprs)
kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=stages))
# shared-memory buffers of one page box: [buffers, 1, page, 1, BLOCK_D]
box = rf"memdesc<(\\d+)x1x{page}x1x{cfg['BLOCK_D']}xbf16"
print(json.dumps(dict(
    stages=stages, tma_copies=kernel.asm["ptx"].count("cp.async.bulk.tensor"),
    buffers=sorted({int(n) for n in re.findall(box, kernel.asm["ttgir"])}),
)))
"""


def test_compiles_to_pipelined_tma_for_sm90():
    """Compiled for Hopper (sm_90, no GPU needed): K and V arrive by TMA bulk-tensor copies, and the pipeliner
    keeps num_stages - 1 tiles of K and V in shared memory (the page ids are fetched a tile ahead for that)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_SM90], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tma_copies"] > 0, result
    assert max(result["buffers"]) == result["stages"] - 1, f"K/V boxes buffered {result['buffers']} deep: {result}"
