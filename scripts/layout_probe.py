"""Is the 12-KV-head cache slower to read because of its token row (12 x 256 B = 3 KB)? The same rows with the cache
stored three ways: NHD as the benchmark stores it, NHD with room for 16 heads per token (a strided view of the same
12 heads: 4 KB token rows, same bytes read), and HND (each head's page a contiguous 4 KB block); 32 KV heads for
contrast. Graph µs with the plan (``plan_decode``), every variant checked against the float64 reference.

    PYTHONPATH=src python scripts/layout_probe.py > layout.log
"""

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import decode_attention, plan_decode
from flashdecode.bench import probe_case
from flashdecode.check import max_err

# (lengths, Hq, Hkv); the rows are >= 400 MB, so L2 holds none of them between calls
ROWS = [([65536], 12, 12), ([1024] * 64, 12, 12), ([16384] * 4, 12, 12), ([32768], 32, 32), ([4096] * 64, 32, 8)]


def layouts(case, hkv):
    """(name, k, v, kv_layout) views of the case's cache."""
    yield "nhd", case.k_cache, case.v_cache, "NHD"
    pad = 16 if hkv < 16 else 2 * hkv
    big = [torch.zeros(*c.shape[:2], pad, c.shape[3], dtype=c.dtype, device=c.device)
           for c in (case.k_cache, case.v_cache)]
    for b, c in zip(big, (case.k_cache, case.v_cache)):
        b[:, :, :hkv] = c
    yield f"nhd-pad{pad}", big[0][:, :, :hkv], big[1][:, :, :hkv], "NHD"
    del big
    hnd = [c.transpose(1, 2).contiguous() for c in (case.k_cache, case.v_cache)]
    yield "hnd", hnd[0], hnd[1], "HND"


def main():
    print(f"{'row':>16} {'layout':>10} {'µs':>7} {'GB/s':>6}")
    for lens, hq, hkv in ROWS:
        case, ref, _ = probe_case(lens, hq, hkv)
        name = f"{len(lens)}x{lens[0]} {hq}/{hkv}"
        nbytes = 2 * sum(lens) * hkv * 128 * 2
        for label, k, v, layout in layouts(case, hkv):
            plan = plan_decode(case.q, k, case.cache_seqlens, case.block_table, kv_layout=layout)

            def fn(k=k, v=v, layout=layout, plan=plan, case=case):
                return decode_attention(case.q, k, v, case.cache_seqlens, case.block_table, kv_layout=layout, plan=plan)

            assert max_err(fn(), ref) < 2e-2, (name, label)
            us = do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
            print(f"{name:>16} {label:>10} {us:7.1f} {nbytes / us / 1e3:6.0f}  {plan.backend} S={plan.num_splits}",
                  flush=True)
        del case


if __name__ == "__main__":
    main()
