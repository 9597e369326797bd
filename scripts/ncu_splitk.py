"""One split-K call on 8 x 2048 28/4 (bf16), planned in place or with fixed splits, for Nsight Compute:

    ncu --kernel-name regex:_partial_kernel --launch-skip 1 --launch-count 1 --section SpeedOfLight \\
        --section LaunchStats --section Occupancy --section WarpStateStats python scripts/ncu_splitk.py planned

    python scripts/ncu_splitk.py fixed16      # the same 512 chunks as 16 fixed splits per sequence

The first call compiles (skipped by --launch-skip 1), the second is profiled. The question: why the planned partial
kernel takes ~1 µs longer than fixed splits with the same chunks (docs/design.md, "How splits are chosen").
"""

import sys

import torch

from flashdecode import triton_splitk
from flashdecode.cases import random_paged_case

mode = sys.argv[1] if len(sys.argv) > 1 else "planned"
c = random_paged_case([2048] * 8, 28, 4, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
out = torch.empty_like(c.q)
splits = None if mode == "planned" else int(mode.removeprefix("fixed"))
for _ in range(2):
    triton_splitk.decode_splitk(*c.args, 128**-0.5, out, None, num_splits=splits)
torch.cuda.synchronize()
print(f"{mode}: done")
