"""SASS instruction counts in the main loop of the single passes, tl and Gluon, compiled for sm_90 without a GPU.

Each kernel is compiled as a launch would specialise it (bf16, head dim 128, group 6, page 16, one query token, PDL,
no LSE; pointers and strides divisible by 16), disassembled with the cuobjdump that Triton ships, and its longest
backward branch's body taken as the main loop. Columns: the loop's instructions, then a few opcodes (HMMA: tensor
core products, LDSM: shared-memory matrix loads, LDS / STS: other shared loads / stores, PRMT: byte permutes,
F2FP: conversions to fp16 pairs, LDGSTS: async copies, LDG: global loads (the page ids), BAR: barriers, SHFL: warp
shuffles, IMAD: integer multiply-adds (address arithmetic)). The fp8 rows compile the Gluon kernel for an e4m3
cache: V staged as fp16, or by ``v_perm`` (4-byte loads and an in-register transpose), at 32- and 64-token steps,
the last under decode_single_gluon's 128-register cap. Used in docs/design.md, "A Gluon single pass in the
library", to read why the Gluon kernel loses where it does and what the fp8 forms cost (a lead, not a timing).

    python scripts/sass_loop_counts.py    # CPU only, ~1 minute
"""

import collections
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "src")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from flashdecode import gluon_single, triton_common, triton_single  # noqa: E402
from sm90_compile import signature  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
POINTERS = dict(Q="*bf16", K="*bf16", V="*bf16", OUT="*bf16", LSE="*fp32", ALIBI="*fp32", SINKS="*fp32")
# integer arguments a launch does not mark divisible by 16 here (unit strides of the lengths and the table's columns)
UNALIGNED = ("stride_sl", "stride_btp")
SHAPE = dict(GROUP=6, HEAD_DIM=128, PAGE_SIZE=16, WRITE_LSE=False, USE_PDL=True)
OPCODES = ("HMMA", "LDSM", "LDS", "STS", "PRMT", "F2FP", "LDGSTS", "LDG", "BAR", "SHFL", "MUFU", "FFMA", "IMAD", "IADD3",
           "ISETP")


def _defaults(kernel):
    return {p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}


def compile_gluon(block_n, stages, defer_sum=True, fp8=False, v_perm=False, maxnreg=0):
    """The Gluon kernel as decode_single_gluon launches it; fp8: an e4m3 cache (V staged as fp16, or by v_perm)."""
    kernel = gluon_single._decode_single_gluon_kernel
    consts = {**_defaults(kernel), **SHAPE, "BLOCK_N": block_n, "STAGES": stages, "SAME_STRIDES": True,
              "DEFER_SUM": defer_sum, "KV_FP8": fp8, "V_PERM": v_perm}  # fmt: skip
    pointers = dict(POINTERS, K="*fp8e4nv", V="*fp8e4nv") if fp8 else POINTERS
    sig, attrs = signature(kernel, consts, pointers, UNALIGNED)
    options = dict(num_warps=4, **({"maxnreg": maxnreg} if maxnreg else {}))
    return triton.compile(GluonASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=options)  # fmt: skip


def compile_tl(tile):
    kernel = triton_single._decode_single_kernel
    cfg = {**triton_common.launch_config(128, 6, torch.bfloat16, 1, 2, single=True), **tile}
    options = {k: cfg.pop(k) for k in ("num_warps", "num_stages", "maxnreg") if k in cfg}
    consts = {**_defaults(kernel), **SHAPE, **cfg, "DOT_F32": False, "HEAD_BLOCKS": 1, "OFFS_I32": True,
              "EARLY_PAGES": True, "HAS_SOFTCAP": False, "HAS_ALIBI": False, "HAS_SINKS": False, "HAS_WINDOW": False,
              "Q_LEN": 1, "KV_FP8": 0, "SCALE_PTR": False}  # fmt: skip
    consts = {k: v for k, v in consts.items() if k in kernel.arg_names}
    sig, attrs = signature(kernel, consts, POINTERS, UNALIGNED)
    return triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=options)


def loop_counts(compiled):
    """(instructions in the longest backward branch's body, Counter of their opcodes)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    lines = [(int(m.group(1), 16), line) for line in sass.splitlines() if (m := re.search(r"/\*([0-9a-f]{4})\*/", line))]
    start, end = 0, -1
    for addr, line in lines:
        target = re.search(r"BRA .*?(0x[0-9a-f]+)", line)
        if target and int(target.group(1), 16) < addr and addr - int(target.group(1), 16) > end - start:
            start, end = int(target.group(1), 16), addr
    body = [line for addr, line in lines if start <= addr <= end]
    ops = collections.Counter(m.group(1) for line in body if (m := re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)))
    return len(body), ops


def main():
    kernels = {
        "tl one wave, 128 x 3": compile_tl(triton_common.PREFETCH_ONE_WAVE_TILE),
        "tl, 32 x 3": compile_tl(triton_common.PREFETCH_TILE),
        "gluon 128 x 3": compile_gluon(128, 3),
        "gluon 32 x 2": compile_gluon(32, 2),
        "gluon 32 x 2, sums a step": compile_gluon(32, 2, defer_sum=False),
        "gluon fp8 32 x 2, V staged": compile_gluon(32, 2, fp8=True),
        "gluon fp8 32 x 2, v_perm": compile_gluon(32, 2, fp8=True, v_perm=True),
        "gluon fp8 64 x 2, v_perm": compile_gluon(64, 2, fp8=True, v_perm=True),
        "gluon fp8 64 x 2, v_perm 128r": compile_gluon(64, 2, fp8=True, v_perm=True, maxnreg=128),
    }
    print(f"{'kernel (tokens x buffers)':<32}{'loop':>6}" + "".join(f"{op:>7}" for op in OPCODES))
    for name, compiled in kernels.items():
        size, ops = loop_counts(compiled)
        print(f"{name:<32}{size:>6}" + "".join(f"{ops[op]:>7}" for op in OPCODES))


if __name__ == "__main__":
    main()
