"""Op counts of the default-path kernels' TTGIR for sm90, compiled without a GPU (no launch).

Checks that the model-feature switches compile away when off:
    git archive <old commit> src/flashdecode | tar -x -C /tmp/old
    python scripts/ttgir_ops.py /tmp/old/src > old.txt; python scripts/ttgir_ops.py src > new.txt; diff old.txt new.txt
Default path: bf16, head_dim 128, group 4, page 16, BLOCK_N 64, one query token, no features. Pointers and strides
are marked divisible by 16, as a launch specialises them on such a cache (without it no load is wide enough for an
async copy and nothing is pipelined). Each kernel's line also gives its async copies and shared memory: 0 copies
means the pipeliner left the K/V loads synchronous (docs/design.md, "Page ids two tiles ahead").
"""

import collections
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "src")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from flashdecode import triton_single, triton_splitk  # noqa: E402
from sm90_compile import signature  # noqa: E402

CONSTS = dict(
    GROUP=4, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_H=16, BLOCK_N=64, BLOCK_D=128, DOT_F32=False, USE_DOT=True,
    WRITE_LSE=True, HEAD_BLOCKS=1, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_SINKS=False, HAS_WINDOW=False, Q_LEN=1,
    KV_FP8=False, SCALE_PTR=False, OFFS_I32=True, PREFETCH_PAGES=False, SPLIT_TOKENS=0, FUSED_MAX=0, MERGE_UNROLL=4,
    INLINE_PLAN=False, BLOCK_B=1, LOG2_BLOCK_N=6, NUM_CAND=1, SATURATION=4, OVERHEAD=32, HEADS_FIRST=False,
    NUM_SMS=132,
)  # fmt: skip
POINTERS = dict(Q="*bf16", K="*bf16", V="*bf16", OUT="*bf16", LSE="*fp32", O_PART="*fp32", LSE_PART="*fp32")


def op_counts(kernel, **extra):
    consts = {k: v for k, v in {**CONSTS, **extra}.items() if k in kernel.arg_names}
    # the constexprs CONSTS leaves out take their defaults (else they would be typed as pointers below)
    consts.update({p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default and p.name not in consts})
    sig, attrs = signature(kernel, consts, POINTERS)
    compiled = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=4, num_stages=3))  # fmt: skip
    counts = collections.Counter(re.findall(r"\b(?:tt|ttg|ttng|arith|scf|math)\.[a-z_]+", compiled.asm["ttgir"]))
    return counts, compiled.metadata.shared


for label, kernel, extra in (
    ("single", triton_single._decode_single_kernel, {}),
    ("partial planned", triton_splitk._partial_kernel, dict(NUM_SPLITS=0)),
    ("partial fixed", triton_splitk._partial_kernel, dict(NUM_SPLITS=4)),
):
    counts, shared = op_counts(kernel, **extra)
    print(f"{label}: {sum(counts.values())} ops, {counts['ttg.async_copy_global_to_local']} async copies, "
          f"{shared} bytes of shared memory")
    for op, n in sorted(counts.items()):
        print(f"  {op} {n}")
