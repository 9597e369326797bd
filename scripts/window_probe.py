"""Why is windowed split-K slow? Per-kernel GPU time (torch.profiler) and the planned cut, full vs window_left=4096,
4 x 32768 tokens, 32/8 heads, bf16. Prints a table; run on the GPU."""

import torch
from torch.profiler import ProfilerActivity, profile

from flashdecode import decode_attention
from flashdecode.cases import random_paged_case

c = random_paged_case([32768] * 4, 32, 8, 128, 16, torch.bfloat16, "cuda", seed=62, spare_pages=0)
for label, kw in (("full", {}), ("window4096", dict(window_left=4096))):
    for backend in ("triton", "triton_splitk"):
        for _ in range(3):
            decode_attention(*c.args, backend=backend, **kw)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                decode_attention(*c.args, backend=backend, **kw)
            torch.cuda.synchronize()
        rows = [(e.key, e.device_time_total / e.count, e.count) for e in prof.key_averages() if e.device_time_total > 0]
        print(f"== {label} {backend}")
        for name, us, n in sorted(rows, key=lambda r: -r[1])[:6]:
            print(f"   {name[:60]:<60} {us:9.1f} us x{n}")
