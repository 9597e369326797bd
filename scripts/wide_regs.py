"""Registers of the partial kernel for the plan's fixed splits of two MHA rows, merged by the combine launch
(MERGE_WIDE_MAX_SPLITS 0) or in the last split program with one [S, D] load (32)."""

import torch

from flashdecode import plan_decode, triton_splitk
from flashdecode.bench import probe_case
from flashdecode.triton_splitk import decode_splitk

for lens, hq, hkv in (([8192], 32, 32), ([65536], 12, 12)):
    case, ref, _ = probe_case(lens, hq, hkv)
    plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
    for wide in (0, 32):
        triton_splitk.MERGE_WIDE_MAX_SPLITS = wide
        ctr = torch.zeros(hq, dtype=torch.int32, device="cuda") if wide else None
        out = torch.empty_like(case.q)
        decode_splitk(*case.args, 128**-0.5, out, None, num_splits=plan.num_splits, counters=ctr)
        torch.cuda.synchronize()
        print(lens, hq, hkv, "S", plan.num_splits, "wide" if wide else "combine", "err", float((out.float() - ref).abs().max()))
for dev_cache in triton_splitk._partial_kernel.device_caches.values():
    for key, k in dev_cache[0].items():
        print("partial", "n_regs", k.n_regs, "spills", k.n_spills, "shared", k.metadata.shared, "wide" if "MERGE_WIDE" in str(key) else "", str(key)[-200:])
