"""One decode call for Nsight Compute: planned, fixed splits or the single pass, on 8 x 2048 28/4 (bf16) or a row
given as B L Hq Hkv:

    ncu --kernel-name regex:"_partial_kernel|_decode_single" --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \\
        python scripts/ncu_splitk.py planned

    python scripts/ncu_splitk.py fixed16            # the same 512 chunks as 16 fixed splits per sequence
    python scripts/ncu_splitk.py single 40 2048 32 8
    python scripts/ncu_splitk.py single 64 4096 32 8 256   # head dim 256
    python scripts/ncu_splitk.py flashinfer 64 1024 12 12  # FlashInfer's decode (flashinfer_tc: tensor cores)

The first call compiles (skipped by --launch-skip 1), the second is profiled. The questions: why the planned
partial kernel takes ~1 µs longer than fixed splits with the same chunks on 8 x 2048 28/4, and ~20% longer than the
single pass with the same 320 programs on 40 x 2048 32/8 (docs/design.md, "How splits are chosen").
"""

import sys

import torch

from flashdecode import triton_splitk
from flashdecode.cases import random_paged_case
from flashdecode.triton_single import decode_single

mode = sys.argv[1] if len(sys.argv) > 1 else "planned"
batch, length, hq, hkv = (int(a) for a in sys.argv[2:6]) if len(sys.argv) >= 6 else (8, 2048, 28, 4)
head_dim = int(sys.argv[6]) if len(sys.argv) > 6 else 128
c = random_paged_case([length] * batch, hq, hkv, head_dim, 16, torch.bfloat16, "cuda", spare_pages=0)
out = torch.empty_like(c.q)
if mode.startswith("flashinfer"):
    from flashdecode.peers import flashinfer_decode

    peer = flashinfer_decode(c, use_tensor_cores=mode == "flashinfer_tc")
for _ in range(2):
    if mode.startswith("flashinfer"):
        peer(c)
    elif mode == "single":
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        decode_single(*c.args, head_dim**-0.5, out, None, num_sms=sms)
    else:
        splits = None if mode == "planned" else int(mode.removeprefix("fixed"))
        triton_splitk.decode_splitk(*c.args, head_dim**-0.5, out, None, num_splits=splits)
torch.cuda.synchronize()
print(f"{mode} {batch}x{length} {hq}/{hkv} D{head_dim}: done")
