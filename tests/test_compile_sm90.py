"""The kernels compile for Hopper (sm_90) with every switch combination that the interpreter runs.

The interpreter executes kernels as Python, so it accepts code the compiler rejects (a helper that returns a block
in one branch and a literal in the other passed every CPU test and failed on the H200). This test compiles the
kernels for sm_90 without a GPU, in a subprocess without TRITON_INTERPRET, and checks that PDL compiles to
griddepcontrol instructions. A second test runs ptxas on the split-K partial kernel's BLOCK_N-64 and prefetching
BLOCK_N-32 variants and checks they fit the 128 registers per thread that let 4 programs share an SM (one more
register cost 4-20% on the H200: docs/design.md).
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
    # constexprs left out take their defaults (a new one needs no edit here)
    defaults = {p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}
    consts = {**defaults, **{k: v for k, v in consts.items() if k in kernel.arg_names}}
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


FEATURES = dict(HAS_SOFTCAP=True, HAS_ALIBI=True, HAS_SINKS=True, HAS_WINDOW=True, KV_FP8=2 if KV != "*bf16" else 0)
BASE = dict(GROUP=4, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_H=16, BLOCK_N=64, BLOCK_D=128, DOT_F32=False, USE_DOT=True,
            WRITE_LSE=True, HEAD_BLOCKS=1, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_SINKS=False, HAS_WINDOW=False,
            Q_LEN=1, KV_FP8=2 if KV != "*bf16" else 0, SCALE_PTR=False, USE_PDL=True, SPLIT_TOKENS=0, FUSED_MAX=0, MERGE_UNROLL=4,
            INLINE_PLAN=False, BLOCK_B=1, LOG2_BLOCK_N=6, NUM_CAND=1, SATURATION=4, OVERHEAD=32, PREFETCH_PAGES=False,
            HEADS_FIRST=False, NUM_SMS=132, EVEN_B=0, WAVE_SAT=0, LONG_MEAN=0, OFFS_I32=True, V_T=False, LONGEST_B=0)
INLINE = dict(INLINE_PLAN=True, BLOCK_B=16, NUM_CAND=16, WAVE_SAT=3, NARROW=True)
PREFETCH = dict(BLOCK_N=32, LOG2_BLOCK_N=5, PREFETCH_PAGES=True)
for window in (False, True):
    for q_len in (1, 4):
        ptx = compile_sm90(triton_splitk._plan_kernel, dict(
            BLOCK_B=64, BLOCK_N=64, LOG2_BLOCK_N=6, NUM_CAND=16, SATURATION=4, OVERHEAD=32, BLOCK_I=64,
            HAS_WINDOW=window, Q_LEN=q_len, USE_PDL=True, NUM_SMS=132, EVEN_B=0, WAVE_SAT=0, LONG_MEAN=0)).asm["ptx"]
        assert "griddepcontrol.launch_dependents" in ptx
for extra in (dict(NUM_SPLITS=0), dict(NUM_SPLITS=4), dict(NUM_SPLITS=4, SPLIT_TOKENS=1024),
              dict(NUM_SPLITS=0, Q_LEN=4, **FEATURES), dict(NUM_SPLITS=3, SCALE_PTR=True, **FEATURES),
              dict(NUM_SPLITS=0, **INLINE), dict(NUM_SPLITS=0, Q_LEN=4, **INLINE, **FEATURES),
              dict(NUM_SPLITS=0, **dict(INLINE, NARROW=False)),
              dict(NUM_SPLITS=0, **INLINE, **PREFETCH), dict(NUM_SPLITS=4, **PREFETCH, **FEATURES),
              dict(NUM_SPLITS=4, **PREFETCH, OFFS_I32=False), dict(NUM_SPLITS=4, **PREFETCH, EARLY_PAGES=True),
              dict(NUM_SPLITS=3, **PREFETCH, **FEATURES, EARLY_PAGES=True),
              # MHA fixed splits with the prefetching tile (MHA_PREFETCH_TILE: one row a KV head)
              dict(NUM_SPLITS=2, GROUP=1, **PREFETCH, EARLY_PAGES=True),
              dict(NUM_SPLITS=8, GROUP=1, **PREFETCH, **FEATURES)):
    ptx = compile_sm90(triton_splitk._partial_kernel, {**BASE, **extra}).asm["ptx"]
    assert "griddepcontrol.wait" in ptx, extra
# the fused merge: the arrival counter is an acq_rel atomic at GPU scope, the partials are read through L2
for extra in (dict(NUM_SPLITS=0, FUSED_MAX=64), dict(NUM_SPLITS=0, FUSED_MAX=64, Q_LEN=4, HEAD_BLOCKS=2, **FEATURES)):
    ptx = compile_sm90(triton_splitk._partial_kernel, {**BASE, **extra}).asm["ptx"]
    assert "atom.global.gpu.acq_rel.add" in ptx and "ld.global.cg" in ptx, extra
for extra in ({}, dict(Q_LEN=4, **FEATURES), PREFETCH, dict(**PREFETCH, **FEATURES), dict(**PREFETCH, EARLY_PAGES=True),
              dict(**PREFETCH, EARLY_PAGES=True, KV_FP8=FEATURES["KV_FP8"])):
    compile_sm90(triton_single._decode_single_kernel, {**BASE, **extra})
# dual-path calls: every kernel takes the evenness test (the single pass lets the next kernels start)
ptx = compile_sm90(triton_single._decode_single_kernel, {**BASE, **PREFETCH, **FEATURES, "EVEN_B": 512,
                                                        "LONG_MEAN": 1024}).asm["ptx"]
assert "griddepcontrol.launch_dependents" in ptx
# longest-first dispatch: the lengths' test and counting sort before the first load
for extra in (dict(LONGEST_B=512), dict(LONGEST_B=8, **PREFETCH, **FEATURES)):
    compile_sm90(triton_single._decode_single_kernel, {**BASE, **extra})
# a full grid's dual path: the test over a wave's sequences (EVEN_SPAN), longest first, in every kernel
ptx = compile_sm90(triton_single._decode_single_kernel, {**BASE, **PREFETCH, "EVEN_B": 128, "LONGEST_B": 128,
                                                        "EVEN_SPAN": 66}).asm["ptx"]
assert "griddepcontrol.launch_dependents" in ptx
compile_sm90(triton_splitk._partial_kernel, {**BASE, **PREFETCH, "NUM_SPLITS": 0, "FUSED_MAX": 64, "EVEN_B": 128,
                                             "EVEN_SPAN": 66})
compile_sm90(triton_splitk._plan_kernel, dict(
    BLOCK_B=64, BLOCK_N=64, LOG2_BLOCK_N=6, NUM_CAND=16, SATURATION=4, OVERHEAD=32, BLOCK_I=64, HAS_WINDOW=True,
    Q_LEN=1, USE_PDL=True, NUM_SMS=132, EVEN_B=64, WAVE_SAT=0, LONG_MEAN=1024))
compile_sm90(triton_splitk._plan_kernel, dict(
    BLOCK_B=128, BLOCK_N=32, LOG2_BLOCK_N=5, NUM_CAND=16, SATURATION=4, OVERHEAD=64, BLOCK_I=4, HAS_WINDOW=False,
    Q_LEN=1, USE_PDL=True, NUM_SMS=132, EVEN_B=128, WAVE_SAT=3, LONG_MEAN=0, EVEN_SPAN=66, ORDER=True, EQUAL=True,
    NARROW=True))
for extra in (dict(NUM_SPLITS=0, FUSED_MAX=64, EVEN_B=256, LONG_MEAN=1024),
              dict(NUM_SPLITS=0, EVEN_B=16, EQUAL=True, **INLINE, **PREFETCH)):
    compile_sm90(triton_splitk._partial_kernel, {**BASE, **extra})
COMBINE = dict(NUM_SPLITS=0, HEAD_DIM=128, BLOCK_S=256, BLOCK_D=128, BLOCK_DC=32, WRITE_LSE=True, USE_PDL=True,
               MERGED_MAX=64, NUM_SMS=132, INLINE_PLAN=False, BLOCK_B=1, BLOCK_N=16, LOG2_BLOCK_N=4, NUM_CAND=1,
               SATURATION=4, OVERHEAD=32, HAS_WINDOW=False, Q_LEN=1, EVEN_B=0, WAVE_SAT=0, LONG_MEAN=0)
for sinks in (False, True):
    for inline in ({}, dict(INLINE, BLOCK_N=64, LOG2_BLOCK_N=6, MERGED_MAX=1, HAS_WINDOW=True)):
        ptx = compile_sm90(triton_splitk._combine_kernel, {**COMBINE, **inline, "HAS_SINKS": sinks}).asm["ptx"]
        assert "griddepcontrol.wait" in ptx
compile_sm90(triton_splitk._combine_kernel, {**COMBINE, "HAS_SINKS": False, "EVEN_B": 64, "HAS_WINDOW": True,
                                             "LONG_MEAN": 1024})
compile_sm90(triton_splitk._combine_kernel, {**COMBINE, "HAS_SINKS": False, "EVEN_B": 128, "EVEN_SPAN": 66,
                                             "LONG_ONLY": 512})
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
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashdecode import triton_splitk

# as on the GPU: pointers and strides divisible by 16 (so loads vectorise), except the unit strides and counts
NOT16 = ("stride_btp", "stride_sl", "window", "batch", "max_chunks", "num_q_heads", "stride_ot", "num_sms", "len_hint",
         "table_tokens")
FLOATS = ("qk_scale", "softcap", "K_SCALE", "V_SCALE")
kernel = triton_splitk._partial_kernel
BASE = dict(HEAD_DIM=128, PAGE_SIZE=16, BLOCK_H=16, BLOCK_N=64, BLOCK_D=128, DOT_F32=False, USE_DOT=True,
            WRITE_LSE=False, HEAD_BLOCKS=1, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_SINKS=False, HAS_WINDOW=False,
            Q_LEN=1, KV_FP8=False, SCALE_PTR=False, USE_PDL=True, SPLIT_TOKENS=0, NUM_SPLITS=0, FUSED_MAX=0,
            MERGE_UNROLL=triton_splitk.MERGE_UNROLL, INLINE_PLAN=False, BLOCK_B=1, LOG2_BLOCK_N=6, NUM_CAND=1,
            SATURATION=4, OVERHEAD=32, PREFETCH_PAGES=False,
            HEADS_FIRST=False, NUM_SMS=132, EVEN_B=0, WAVE_SAT=0, LONG_MEAN=0, OFFS_I32=True, V_T=False)
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
worst = []
variants = [(g, e) for g in (1, 4, 6, 7, 8) for e in ({}, dict(FUSED_MAX=64))]
# the dual path's evenness test runs before the main loop: one group is enough
variants += [(6, dict(FUSED_MAX=64, EVEN_B=256, LONG_MEAN=1024))]
variants += [(g, dict(INLINE_PLAN=True, BLOCK_B=triton_splitk.inline_block_b(b), NUM_CAND=16, WAVE_SAT=3,
                      NARROW=narrow)) for g in (1, 6, 7) for b in (1, 2, 4, 16) for narrow in (True, False)]
# ...and with the fused merge (INLINE_FUSED_MAX_BATCH)
variants += [(g, dict(INLINE_PLAN=True, BLOCK_B=triton_splitk.inline_block_b(b), NUM_CAND=16, WAVE_SAT=3,
                      NARROW=True, FUSED_MAX=64)) for g in (1, 6) for b in (12, 16, 64)]
# the prefetching 32-token tile (launch_config's PREFETCH_TILE), planner-fed and in place, merging or not
variants += [(g, dict(BLOCK_N=32, LOG2_BLOCK_N=5, PREFETCH_PAGES=True, **inline)) for g in (4, 6, 7, 8)
             for inline in ({}, dict(INLINE_PLAN=True, BLOCK_B=triton_splitk.inline_block_b(16), NUM_CAND=16,
                                     WAVE_SAT=3, NARROW=True),
                            dict(INLINE_PLAN=True, BLOCK_B=triton_splitk.inline_block_b(16), NUM_CAND=16,
                                 WAVE_SAT=3, NARROW=True, FUSED_MAX=64))]
# fixed splits of that tile merged in the last split program, their first page ids loaded before the lengths or not
variants += [(g, dict(BLOCK_N=32, LOG2_BLOCK_N=5, PREFETCH_PAGES=True, NUM_SPLITS=8, FUSED_MAX=64, EARLY_PAGES=early))
             for g in (4, 6, 7) for early in (False, True)]
for group, extra in variants:
    consts = {**{p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}, **BASE, "GROUP": group,
              **extra}
    sig, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            continue
        sig[name] = "fp32" if name in FLOATS else ("*bf16" if name in ("Q", "K", "V", "OUT") else
                    ("*fp32" if name.isupper() and name not in ("SEQLENS", "BLOCK_TABLE", "PLAN", "COUNTERS")
                     else ("*i32" if name.isupper() else "i32")))
        if name not in NOT16 and name not in FLOATS:
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, num_stages=3))
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    info = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True,
                          text=True).stderr
    worst.append((int(re.search(r"Used (\d+) registers", info).group(1)), group, sorted(extra.items())))
print("registers", max(worst))
for w in worst:
    print(*w)
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


_TOKEN_MAJOR = r"""
import sys
sys.path.insert(0, "src")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashdecode import triton_single

NOT16 = ("stride_btp", "stride_sl", "window", "num_q_heads", "stride_ot", "tail_first")
kernel = triton_single._decode_single_kernel
# the single pass's fp8 tile (FP8_LONG_TILE) on a 32/8 e4m3 cache
BASE = dict(GROUP=4, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_H=16, BLOCK_N=128, BLOCK_D=128, DOT_F32=False, USE_DOT=True,
            WRITE_LSE=False, HEAD_BLOCKS=1, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_SINKS=False, HAS_WINDOW=False,
            Q_LEN=1, KV_FP8=2, SCALE_PTR=False, USE_PDL=True, PREFETCH_PAGES=True, EVEN_B=0, LONG_MEAN=0,
            OFFS_I32=True, LONGEST_B=0)
for v_t in (False, True):
    # token-major pages: stride_vt is 1, which the launch specialises to a constant
    consts = {**{p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}, **BASE, "V_T": v_t,
              **({"stride_vt": 1} if v_t else {})}
    sig, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            continue
        sig[name] = ("fp32" if name in ("qk_scale", "softcap", "K_SCALE", "V_SCALE") else
                     "*fp8e4nv" if name in ("K", "V") else "*bf16" if name in ("Q", "OUT") else
                     "*fp32" if name in ("LSE", "SINKS", "ALIBI") else "*i32" if name.isupper() else "i32")
        if name not in NOT16 and not sig[name].startswith("fp"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    ptx = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                         options=dict(num_warps=4, num_stages=3)).asm["ptx"]
    print(f"V_T {v_t}: {ptx.count('ld.shared.u8') + ptx.count('ld.shared.b8')} one-byte shared loads, "
          f"{ptx.count('cp.async.cg.shared.global')} 16-byte async copies")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernels compile natively (scripts/vt_probe.py)")
def test_token_major_fp8_v_needs_no_byte_loads():
    """An fp8 V with head-dim-major pages reaches tl.dot through 128 one-byte shared loads a tile (a thread needs
    pairs of tokens); with token-major pages V is copied to shared memory in 16-byte runs of tokens like K and
    loaded without them (docs/features.md, "Token-major V pages")."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _TOKEN_MAJOR], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    head_major, token_major = (int(line.split(": ")[1].split()[0]) for line in lines[:2])
    copies = [int(line.split(", ")[1].split()[0]) for line in lines[:2]]
    assert head_major >= 64 and token_major == 0, done.stdout
    # V is pipelined through cp.async as K is (not loaded through registers)
    assert copies[1] >= copies[0], done.stdout


_COMBINE_WARPS = r"""
import os, re, subprocess, sys, tempfile
sys.path.insert(0, "src")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashdecode import triton_splitk

kernel = triton_splitk._combine_kernel
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
# fixed splits' wide combine (launch_combine with B * Hq < #SMs): [BLOCK_S, 32] tiles
BASE = dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_DC=32, WRITE_LSE=True, HAS_SINKS=False, USE_PDL=True, MERGED_MAX=1,
            NUM_SMS=132, INLINE_PLAN=False, BLOCK_B=1, BLOCK_N=32, LOG2_BLOCK_N=5, NUM_CAND=1, SATURATION=4,
            OVERHEAD=32, HAS_WINDOW=False, Q_LEN=1)
for splits in (32, 64, 128):
    for warps in (1, 4):
        consts = {**{p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}, **BASE,
                  "NUM_SPLITS": splits, "BLOCK_S": splits}
        sig = {n: "constexpr" if n in consts else ("*bf16" if n == "OUT" else "*fp32" if n in (
               "O_PART", "LSE_PART", "LSE", "SINKS") else "*i32" if n.isupper() else "i32") for n in kernel.arg_names}
        ptx = triton.compile(ASTSource(kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                             options=dict(num_warps=warps, num_stages=3)).asm["ptx"]
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(ptx)
        info = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True,
                              text=True).stderr
        spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", info))
        print(splits, warps, ptx.count("bar.sync"), spills, splits * 32 <= triton_splitk.COMBINE_ONE_WARP_MAX)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU scripts/variant_probe.py combinewarps times it")
def test_one_warp_combine_has_no_barriers():
    """Four warps lay the combine's [BLOCK_S, 32] tile along the chunk axis, so its reductions over the chunks cross
    warps through shared memory (14 or more barriers from 64 chunks); the one warp that launch_combine gives a tile of
    at most COMBINE_ONE_WARP_MAX elements needs no barrier and spills nothing (docs/design.md, "Merging the chunks")."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _COMBINE_WARPS], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [tuple(int(x) if x.isdigit() else x == "True" for x in line.split()) for line in done.stdout.splitlines()]
    assert len(rows) == 6, done.stdout
    for splits, warps, barriers, spills, one_warp in rows:
        assert spills == 0, rows
        if warps == 1:
            assert barriers == 0 and one_warp, rows
        elif splits >= 64:
            assert barriers >= 8, rows
