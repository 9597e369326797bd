"""One decode call with a bf16 or fp8 e4m3 cache, for Nsight Compute:

    ncu --kernel-name regex:"_decode_single_kernel|_partial_kernel" --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \\
        python scripts/ncu_fp8.py e4m3                   # decode_attention, 64 x 4096 32/8
    python scripts/ncu_fp8.py e4m3 single 32 4096        # the single pass with the 128-token fp8 tile
    python scripts/ncu_fp8.py e4m3 fixed32 1 131072      # 32 fixed splits a sequence, the same tile
    python scripts/ncu_fp8.py e4m3vt single 64 4096      # V pages token-major (triton_common.v_token_major)

The first call compiles (skipped by --launch-skip 1), the second is profiled. The questions: what limits the fp8
single pass at ~3.3 TB/s of fp8 bytes (docs/features.md), and why fixed splits of the same tile run at half the
single pass's rate per program (pipeline_probe fp8s).
"""

import sys

import torch

from flashdecode import decode_attention, triton_splitk
from flashdecode.bench import FP8_K_SCALE, FP8_V_SCALE, quantize_kv
from flashdecode.cases import random_paged_case, token_major_v
from flashdecode.triton_common import Features
from flashdecode.triton_single import decode_single

kind = sys.argv[1] if len(sys.argv) > 1 else "e4m3"
mode = sys.argv[2] if len(sys.argv) > 2 else "auto"
batch, length = (int(a) for a in sys.argv[3:5]) if len(sys.argv) >= 5 else (64, 4096)
c = random_paged_case([length] * batch, 32, 8, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
kw, features = {}, Features()
token_major = kind.endswith("vt")
kind = kind.removesuffix("vt")
if kind != "bf16":
    quantize_kv(c, kind)
    kw = dict(k_scale=FP8_K_SCALE, v_scale=FP8_V_SCALE)
    features = Features(kv_fp8=True, k_scale=FP8_K_SCALE, v_scale=FP8_V_SCALE)
if token_major:
    c.v_cache = token_major_v(c.v_cache)
# the single pass's fp8 tile (triton_common.FP8_LONG_TILE)
cfg = dict(BLOCK_N=128, num_warps=4, num_stages=3, PREFETCH_PAGES=True)
out = torch.empty_like(c.q)
for _ in range(2):
    if mode == "auto":
        decode_attention(*c.args, backend="triton", **kw)
    elif mode == "single":
        decode_single(*c.args, 128**-0.5, out, None, config=cfg, features=features)
    else:
        triton_splitk.decode_splitk(*c.args, 128**-0.5, out, None, num_splits=int(mode.removeprefix("fixed")),
                                    config=cfg, features=features)  # fmt: skip
torch.cuda.synchronize()
print(f"{kind}{' token-major V' * token_major} {mode} {batch}x{length}: done")
