"""Registers of the split-K partial kernel for the plan's fixed splits of a few rows, merged by the combine launch
or in the last split program (the plan's counters), as ptxas gave them on this GPU (``n_regs``, spills, shared
memory), and the programs per SM those registers and that shared memory allow. GPU only:

    python scripts/fused_regs.py
"""

import torch

from flashdecode import plan_decode, triton_splitk
from flashdecode.bench import probe_case
from flashdecode.triton_splitk import decode_splitk

ROWS = (([8192] * 8, 32, 32), ([8192] * 8, 32, 16), ([8192] * 6, 12, 12), ([8192] * 2, 40, 40))


def main():
    props = torch.cuda.get_device_properties(0)
    for lens, hq, hkv in ROWS:
        case, ref, _ = probe_case(lens, hq, hkv)
        plan = plan_decode(case.q, case.k_cache, case.cache_seqlens, case.block_table)
        seen = set(_kernels())
        for ctr in (None, torch.zeros(len(lens) * hq, dtype=torch.int32, device="cuda")):
            out = torch.empty_like(case.q)
            decode_splitk(*case.args, 128**-0.5, out, None, num_splits=plan.num_splits, counters=ctr)
            torch.cuda.synchronize()
            err = float((out.float() - ref).abs().max())
            for key, k in _kernels().items():
                if key in seen:
                    continue
                seen.add(key)
                warps = k.metadata.num_warps
                by_regs = props.regs_per_multiprocessor // (k.n_regs * 32 * warps)
                by_smem = props.shared_memory_per_multiprocessor // max(k.metadata.shared + 1024, 1)
                name = f"{len(lens)}x{lens[0]} {hq}/{hkv} S {plan.num_splits}"
                print(f"{name:22s} {'merged' if ctr is not None else 'combine':8s} err {err:.2e} regs {k.n_regs} "
                      f"spills {k.n_spills} shared {k.metadata.shared} warps {warps} -> per SM: regs {by_regs}, "
                      f"shared {by_smem}", flush=True)


def _kernels():
    return {key: k for cache in triton_splitk._partial_kernel.device_caches.values() for key, k in cache[0].items()}


if __name__ == "__main__":
    main()
