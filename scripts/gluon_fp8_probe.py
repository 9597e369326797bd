"""Where does the Gluon single pass pay for an fp8 (e4m3) cache? Its fp8 form reads K^T's MMA operand straight from
the 8-bit ring (4 bytes a load) and converts it in registers, and converts V's 16-byte rows to fp16 staged in shared
memory for P . V's operand loads; the tl kernels' fp8 tile reads V by one-byte shared loads (docs/design.md, fp8).
PERF.md asks an fp8 cache to run >= 1.8x faster than bf16 on large rows.

Each row, graph µs (caches rotated, one process): the library's plan on the bf16 cache, the plan on the e4m3 cache
(which takes the Gluon kernel where ``gluon_single.pays``), the tl single pass on the e4m3 cache, the Gluon kernel
on the e4m3 cache with ring variants gNxS[p][r][/sK] (N tokens a step, S buffers; p: V's operand by the in-register
transpose, ``v_perm``; r: at most 128 registers a thread; /sK: K splits a sequence and KV head, merged by
triton_splitk's combine), and each fp8 time's speed-up over bf16's plan. Every output is checked against the float64
reference of the dequantised cache first.

    python scripts/gluon_fp8_probe.py [--rows B,L,Hq,Hkv;...] [--variants g32x2,g32x2p]   # on the GPU
"""

import argparse
import itertools

import torch

from flashdecode import decode_attention, gluon_single, plan_decode
from flashdecode.bench import (
    FP8_K_SCALE,
    FP8_V_SCALE,
    ProbeLog,
    _l2_bytes,
    probe_graph_us,
    probe_rows,
    quantize_kv,
    rotation_copies,
)
from flashdecode.cases import random_paged_case
from flashdecode.reference import reference_dense
from flashdecode.triton_common import Features
from flashdecode.triton_single import decode_single

ROWS = [(64, 4096, 32, 8), (128, 2048, 32, 8), (256, 256, 12, 2), (512, 1024, 12, 2), (128, 1024, 16, 8),
        (64, 1024, 12, 2)]  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="", help="B,L,Hq,Hkv;... instead of ROWS")
    ap.add_argument("--variants", default="g32x2",
                    help="gNxS[p][r][/sK]: N tokens a step, S ring buffers, p v_perm, r 128 registers, K splits")
    args = ap.parse_args()
    rows = probe_rows(args.rows, ROWS)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    log = ProbeLog("gluon_fp8")
    l2 = _l2_bytes("cuda")
    for batch, length, hq, hkv in rows:
        c16 = random_paged_case([length] * batch, hq, hkv, 128, 16, torch.bfloat16, "cuda", spare_pages=0)
        c8 = quantize_kv(random_paged_case([length] * batch, hq, hkv, 128, 16, torch.bfloat16, "cuda", spare_pages=0),
                         "e4m3")  # fmt: skip
        ref16, _ = reference_dense(*c16.args, device="cuda")
        ref8, _ = reference_dense(*c8.args, k_scale=FP8_K_SCALE, v_scale=FP8_V_SCALE, device="cuda")
        copies16, copies8 = rotation_copies(c16, l2), rotation_copies(c8, l2)
        plan16 = plan_decode(c16.q, c16.k_cache, c16.cache_seqlens, c16.block_table)
        plan8 = plan_decode(c8.q, c8.k_cache, c8.cache_seqlens, c8.block_table)
        out = torch.empty_like(c16.q)
        scale = 128**-0.5
        scales = dict(k_scale=FP8_K_SCALE, v_scale=FP8_V_SCALE)
        fp8 = Features(kv_fp8=True, **scales)
        variants = {
            "bf16 plan": (copies16, ref16, lambda c: decode_attention(*c.args, out=out, plan=plan16)),
            "e4m3 plan": (copies8, ref8, lambda c: decode_attention(*c.args, out=out, plan=plan8, **scales)),
            "e4m3 tl": (copies8, ref8, lambda c: decode_single(*c.args, scale, out, features=fp8, num_sms=sms,
                                                              gluon=False)),
        }  # fmt: skip
        for v in args.variants.split(","):
            ring, _, sp = v.partition("/s")
            n, s = map(int, ring[1:].rstrip("pr").split("x"))
            regs = 128 if ring.endswith("r") else 0
            variants[v] = (copies8, ref8, lambda c, n=n, s=s, vp="p" in ring, r=regs, k=int(sp or 1):
                           gluon_single.decode_single_gluon(*c.args, scale, out, stages=s, block_n=n, v_perm=vp,
                                                            maxnreg=r, splits=k, **scales))  # fmt: skip
        errs, times = {}, {key: [] for key in variants}
        for key, (copies, ref, fn) in variants.items():
            out.fill_(float("nan"))
            fn(copies[0])
            errs[key] = (out.double() - ref).abs().max().item()
        for _ in range(2):
            for key, (copies, ref, fn) in variants.items():
                it = itertools.cycle(copies)
                ok = errs[key] < 5e-2
                times[key].append(probe_graph_us(lambda fn=fn, it=it: fn(next(it))) if ok else float("nan"))
        bf16 = min(times["bf16 plan"])
        name = f"{batch}x{length} {hq}/{hkv}"
        log.row(
            dict(row=name, programs_per_sm=batch * hkv / sms, plans=[plan16.backend, plan8.backend], errs=errs,
                 us=times),
            f"{name:<16} {batch * hkv / sms:5.2f}/SM "
            + "  ".join(f"{k} {min(v):7.2f}" + ("" if k == "bf16 plan" else f" ({bf16 / min(v):.2f}x)")
                        for k, v in times.items()),
        )  # fmt: skip
    log.close()


if __name__ == "__main__":
    main()
