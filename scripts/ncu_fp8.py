"""One decode_attention call on 64 x 4096 32/8 (single pass) with a bf16 or fp8 e4m3 cache, for Nsight Compute:

    ncu --kernel-name regex:_decode_single_kernel --launch-skip 1 --launch-count 1 --section SpeedOfLight \\
        --section WarpStateStats --section MemoryWorkloadAnalysis python scripts/ncu_fp8.py e4m3

The first call compiles (skipped by --launch-skip 1), the second is profiled. What limits the fp8 single pass at
~2.7 TB/s of fp8 bytes (docs/features.md) is the question it answers.
"""

import sys

import torch

from flashdecode import decode_attention
from flashdecode.bench import FP8_K_SCALE, FP8_V_SCALE
from flashdecode.cases import random_paged_case

kind = sys.argv[1] if len(sys.argv) > 1 else "e4m3"
c = random_paged_case([4096] * 64, 32, 8, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
kw = {}
if kind != "bf16":
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[kind]
    c.k_cache = (c.k_cache.float() / FP8_K_SCALE).to(fp8)
    c.v_cache = (c.v_cache.float() / FP8_V_SCALE).to(fp8)
    kw = dict(k_scale=FP8_K_SCALE, v_scale=FP8_V_SCALE)
for _ in range(2):
    decode_attention(*c.args, backend="triton", **kw)
torch.cuda.synchronize()
print(f"{kind}: done")
