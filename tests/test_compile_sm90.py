"""The kernels compile for Hopper (sm_90) with every switch combination that the interpreter runs.

The interpreter executes kernels as Python, so it accepts code the compiler rejects (a helper that returns a block
in one branch and a literal in the other passed every CPU test and failed on the H200). This test compiles the
kernels for sm_90 without a GPU, in a subprocess without TRITON_INTERPRET, and checks that PDL compiles to
griddepcontrol instructions. A second test runs ptxas on the split-K partial kernel's BLOCK_N-64 and prefetching
BLOCK_N-32 variants, with the planned cut over 1 to 512 lengths, and checks they fit the 128 registers per thread
that let 4 programs share an SM (one more register cost 4-20% on the H200: docs/design.md).
"""

import os
import subprocess
import sys

import pytest
import torch

_COMPILE = r"""
import sys
sys.path.insert(0, "src")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashdecode import triton_single, triton_splitk

FLOATS = ("qk_scale", "softcap", "K_SCALE", "V_SCALE")
KV = sys.argv[1]
POINTERS = dict(Q="*bf16", K=KV, V=KV, OUT="*bf16", LSE="*fp32", O_PART="*fp32", LSE_PART="*fp32", SINKS="*fp32",
                ALIBI="*fp32")


def compile_sm90(kernel, consts):
    consts = {k: v for k, v in consts.items() if k in kernel.arg_names}
    # scales are floats, or fp32 pointers with SCALE_PTR (0-d device tensors)
    sig = {}
    for name in kernel.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in FLOATS and not (name.endswith("_SCALE") and consts.get("SCALE_PTR")):
            sig[name] = "fp32"
        elif name.isupper():
            sig[name] = POINTERS.get(name, "*i32")
        else:
            sig[name] = "i32"
    src = ASTSource(kernel, sig, consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3))


FEATURES = dict(HAS_SOFTCAP=True, HAS_ALIBI=True, HAS_SINKS=True, HAS_WINDOW=True, KV_FP8=KV != "*bf16")
BASE = dict(GROUP=4, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_H=16, BLOCK_N=64, BLOCK_D=128, DOT_F32=False, USE_DOT=True,
            WRITE_LSE=True, HEAD_BLOCKS=1, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_SINKS=False, HAS_WINDOW=False,
            Q_LEN=1, KV_FP8=KV != "*bf16", SCALE_PTR=False, USE_PDL=True, SPLIT_TOKENS=0, PREFETCH_PAGES=False,
            HEADS_FIRST=True, BLOCK_B=1)
PLANNED = dict(NUM_SPLITS=0, BLOCK_B=512)
PREFETCH = dict(BLOCK_N=32, PREFETCH_PAGES=True)
for extra in (dict(NUM_SPLITS=0), dict(NUM_SPLITS=4), dict(NUM_SPLITS=4, SPLIT_TOKENS=1024, HEADS_FIRST=False),
              dict(NUM_SPLITS=0, Q_LEN=4, **FEATURES), dict(NUM_SPLITS=3, SCALE_PTR=True, **FEATURES),
              dict(PLANNED), dict(PLANNED, Q_LEN=4, **FEATURES), dict(PLANNED, **PREFETCH),
              dict(NUM_SPLITS=4, **PREFETCH, **FEATURES)):
    ptx = compile_sm90(triton_splitk._partial_kernel, {**BASE, **extra}).asm["ptx"]
    assert "griddepcontrol.launch_dependents" in ptx, extra
for extra in ({}, dict(Q_LEN=4, **FEATURES), PREFETCH, dict(**PREFETCH, **FEATURES)):
    compile_sm90(triton_single._decode_single_kernel, {**BASE, **extra})
for sinks, splits in ((False, 0), (True, 0), (True, 4)):
    ptx = compile_sm90(triton_splitk._combine_kernel, dict(
        NUM_SPLITS=splits, HEAD_DIM=128, BLOCK_S=4, BLOCK_SO=16, BLOCK_R=4, BLOCK_D=128, BLOCK_DC=128, WRITE_LSE=True,
        HAS_SINKS=sinks,
        USE_PDL=True)).asm["ptx"]
    assert "griddepcontrol.wait" in ptx
print("compiled")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU every test compiles the kernels natively")
@pytest.mark.parametrize("kv", ["*bf16", "*fp8e4nv"])
def test_kernels_compile_for_sm90(kv):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _COMPILE, kv], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


_REGISTERS = r"""
import os, re, subprocess, sys, tempfile
sys.path.insert(0, "src")
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashdecode import triton_splitk

# as on the GPU: pointers and strides divisible by 16 (so loads vectorise), except the unit strides and counts
NOT16 = ("stride_btp", "stride_sl", "window", "batch", "slots_per_seq", "num_q_heads", "stride_ot")
FLOATS = ("qk_scale", "softcap", "K_SCALE", "V_SCALE")
kernel = triton_splitk._partial_kernel
BASE = dict(HEAD_DIM=128, PAGE_SIZE=16, DOT_F32=False, WRITE_LSE=False, HEAD_BLOCKS=1, HAS_SOFTCAP=False,
            HAS_ALIBI=False, HAS_SINKS=False, HAS_WINDOW=False, Q_LEN=1, KV_FP8=False, SCALE_PTR=False, USE_PDL=True,
            SPLIT_TOKENS=0, NUM_SPLITS=0, HEADS_FIRST=True, BLOCK_B=1)
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
worst = []
# the tiles split_config gives bf16 head_dim 128 where shared memory lets 4 programs share an SM: the small-group
# split tile (group 1, 32 KV heads) and the prefetching 32-token tile of groups 4-8; the planned cut over 1 to 512
# lengths, and fixed splits
variants = []
for group, hkv in ((1, 32), (4, 8), (6, 2), (7, 4), (8, 8)):
    cfg = triton_splitk.split_config(128, group, torch.bfloat16, 1, 2, hkv)[0]
    variants += [(group, dict(cfg, BLOCK_B=b)) for b in (1, 16, 512)] + [(group, dict(cfg, NUM_SPLITS=4))]
for group, extra in variants:
    consts = {**BASE, "GROUP": group, **extra}
    options = dict(num_warps=consts.pop("num_warps"), num_stages=consts.pop("num_stages"))
    sig, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            continue
        sig[name] = "fp32" if name in FLOATS else ("*bf16" if name in ("Q", "K", "V", "OUT") else
                    ("*fp32" if name.isupper() and name not in ("SEQLENS", "BLOCK_TABLE", "CHUNKS")
                     else ("*i32" if name.isupper() else "i32")))
        if name not in NOT16 and name not in FLOATS:
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    info = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True,
                          text=True).stderr
    worst.append((int(re.search(r"Used (\d+) registers", info).group(1)), group, sorted(map(str, extra.items()))))
print("registers", max(worst))
assert max(worst)[0] <= 128, worst
print("fits")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the benchmark measures occupancy directly")
def test_split_partial_keeps_four_programs_per_sm():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _REGISTERS], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0 and "fits" in done.stdout, (done.stdout + done.stderr)[-3000:]
