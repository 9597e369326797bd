"""Host time per eager decode_attention call on the GPU: wall time of many calls on a tiny case (the GPU work is a
few microseconds, so the host sets the pace), and a cProfile of the slowest path. Run on the GPU machine."""

import cProfile
import pstats
import time

import torch

from flashdecode import decode_attention
from flashdecode.cases import random_paged_case

c = random_paged_case([128] * 8, 28, 4, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
out = torch.empty_like(c.q)
for backend in ("triton", "triton_splitk"):
    for _ in range(20):
        decode_attention(*c.args, backend=backend, out=out)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(500):
        decode_attention(*c.args, backend=backend, out=out)
    host = (time.perf_counter() - t) / 500 * 1e6
    torch.cuda.synchronize()
    print(f"{backend}: {host:.1f} us host per call (500 calls, launches queued, no sync inside)")
prof = cProfile.Profile()
prof.enable()
for _ in range(300):
    decode_attention(*c.args, backend="triton_splitk", out=out)
prof.disable()
torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
