"""Host time of the pieces of an eager replayed decode_attention call, on the GPU machine (µs per call, best of 7
rounds of 300 queued calls): the allocation and device calls it makes, then per case the whole call and its
compiled launches as the cached launcher makes them (launch_all), through CudaLauncher.__call__'s Python wrapper and
calling the C launcher under it (``launcher.DIRECT``). docs/design.md, "Host time".

    python scripts/host_pieces.py
"""

import os
import time

import torch
from triton.runtime.driver import driver

import flashdecode
from flashdecode import decode_attention, launcher
from flashdecode.cases import random_paged_case


def t(fn, n=300, rounds=7):
    """Best µs per call of fn over `rounds` rounds of n calls (queued: no sync inside a round)."""
    best = 1e9
    for _ in range(rounds):
        torch.cuda.synchronize()
        s = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - s) / n * 1e6)
    torch.cuda.synchronize()
    return best


def main():
    print("flashdecode from", flashdecode.__file__)
    c = random_paged_case([2048] * 8, 28, 4, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
    q = c.q
    print(f"current_device {t(torch.cuda.current_device):.2f}  _cuda_getDevice {t(torch._C._cuda_getDevice):.2f}")
    print(f"empty(shape) {t(lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device)):.2f}  "
          f"empty_like {t(lambda: torch.empty_like(q, memory_format=torch.contiguous_format)):.2f}  "
          f"empty uint8 {t(lambda: torch.empty(123456, dtype=torch.uint8, device=q.device)):.2f}")
    print(f"environ.get {t(lambda: os.environ.get('FLASHDECODE_DEBUG', '0')):.2f}")
    gs, gd = driver.active.get_current_stream, driver.active.get_current_device
    print(f"get_stream(get_device()) {t(lambda: gs(gd())):.2f}")
    for label, lens, hq, hkv in (("8x128 28/4", [128] * 8, 28, 4), ("8x2048 28/4", [2048] * 8, 28, 4),
                                 ("64x1024 12/2", [1024] * 64, 12, 2)):
        c = random_paged_case(lens, hq, hkv, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
        out = torch.empty_like(c.q)
        stream = gs(gd())
        timing = {}
        for direct in (False, True):
            launcher.clear()
            launcher.DIRECT = direct
            decode_attention(*c.args, out=out)  # records
            ((_, rep),) = launcher._cache.items()
            full = t(lambda: decode_attention(*c.args, out=out))
            # the replay's slots: q, k, v, lengths, table, out, then lse, 4 feature tensors, a plan's counters and
            # host table (None here), then the workspaces
            ptrs = [x.data_ptr() for x in (c.q, c.k_cache, c.v_cache, c.cache_seqlens, c.block_table, out)]
            ptrs += [None] * 7
            buf = torch.empty(rep.workspace_bytes or 1, dtype=torch.uint8, device="cuda")
            ptrs += [buf.data_ptr() + o for o in rep.offsets]
            timing[direct] = full, t(lambda: rep.launch_all(ptrs, stream))
            torch.cuda.synchronize()
        launcher.DIRECT = True
        (full_w, la_w), (full_d, la_d) = timing[False], timing[True]
        print(f"{label}: launches {len(rep.launches)}  through Triton's wrapper: full call {full_w:.2f} launch_all "
              f"{la_w:.2f}  calling the C launcher (launcher.DIRECT): full call {full_d:.2f} launch_all {la_d:.2f}")


if __name__ == "__main__":
    main()
