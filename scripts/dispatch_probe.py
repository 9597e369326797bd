"""Where the GPU's block scheduler puts the first CTAs of a grid, when the rest of the grid is idle CTAs that return
at once (the planned split-K grid's unused chunk slots). perf_probe grid at c9c612d: fixed splits with such trailing
idle slots took 110.5 us instead of 95.1 on 40 x 2048 32/8. If the scheduler spreads the busy CTAs over every SM
whatever the grid's size, the idle ones are not the cause; if it packs them onto fewer SMs, they are.

A spin kernel: CTAs < busy hold their SM for `ns` nanoseconds (globaltimer), the others return; each records its
SM id (%smid). 16 warps a CTA: at most 4 fit an SM (64 warps), as the partial kernel's 4. Prints, for each
(busy, grid) pair, how many SMs the busy CTAs landed on and the most on one SM; writes $OUT/dispatch.json.

H200 at cee3695 (docs/benchmarks/h200-2026-11-23/sweeps/dispatch-cee3695*): the first 320 CTAs land at most 3 a SM
in grids of 320-384 and 448-527, but 4 a SM (on 132 SMs still) in grids of 400 and of 528 (one resident set) or
more: past a resident set, trailing idle CTAs make the busy ones share SMs.

    python scripts/dispatch_probe.py         # busy CTAs ahead of idle ones, grids up to 4096
    python scripts/dispatch_probe.py fine    # grids around 4 CTAs per SM (and 2, at 32 warps)
    python scripts/dispatch_probe.py idle    # 16 busy CTAs in every 34 (a planned grid's order), 4 or 5 a SM
    python scripts/dispatch_probe.py mha     # the MHA tiles' planned grids (2 or 4 a SM) with 8, 4 or 3 slot programs
                                             # per SM: 1 x 32768 40/40 (8 busy of 28, 15, 11), 1 x 131072 12/12
                                             # (32 of 89, 45, 34)
"""

import json
import os
import sys

import torch
import triton
import triton.language as tl

from flashdecode.launcher import padded_shared_memory


@triton.jit
def _spin(SMID, busy, ns, period):
    pid = tl.program_id(0)
    smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)
    if pid % period < busy:
        t0 = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64, is_pure=False,
                                       pack=1)  # fmt: skip
        t = t0
        while t - t0 < ns:
            t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64, is_pure=False,
                                          pack=1)  # fmt: skip
    tl.store(SMID + pid, smid)


def place(busy: int, grid: int, ns: int = 200_000, warps: int = 16, period: int = 0, per_sm: int = 0) -> dict:
    """Run the spin kernel; period > 0: the first `busy` CTAs of every `period` are busy (the planned grid's
    (chunk slots, heads) order), else the first `busy` of the grid. per_sm > 0: at most that many CTAs an SM
    (shared memory padded as ``launcher.cap_programs_per_sm`` pads it)."""
    smid = torch.zeros(grid, dtype=torch.int32, device="cuda")
    if per_sm:
        # the same arguments (Triton specialises on them), one CTA: compiles the kernel whose launches are padded
        compiled = _spin[(1,)](smid, busy, ns, period or grid, num_warps=warps)
        smem = triton.runtime.driver.active.utils.get_device_properties(0)["max_shared_mem"] + 1024
        compiled.packed_metadata = (warps, 1, padded_shared_memory(0, per_sm, smem))
    _spin[(grid,)](smid, busy, ns, period or grid, num_warps=warps)
    torch.cuda.synchronize()
    pids = torch.arange(grid, device="cuda")
    smid = smid[pids % (period or grid) < busy]
    ids = smid.tolist()
    per_sm = torch.bincount(smid.long(), minlength=torch.cuda.get_device_properties(0).multi_processor_count)
    return dict(busy=busy, grid=grid, sms_used=int((per_sm > 0).sum()), max_per_sm=int(per_sm.max()),
                sms_with=torch.bincount(per_sm).tolist(),
                first_ids=ids[:24])  # fmt: skip


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = []
    runs = [(16, busy, grid) for busy in (sms // 2, 320, 384, 512) for grid in (busy, busy + 64, 4 * sms, 1376, 4096)]
    # "fine": grids just below and at 4 CTAs per SM (16 warps), all busy or the first 320 / 384; at 2 per SM (32)
    if sys.argv[1:] == ["fine"]:
        runs = [(16, b, g) for g in (400, 448, 480, 500, 512, 520, 526, 527, 528, 529, 600) for b in (320, 384, g)
                if b <= g]
        runs += [(32, b, g) for g in (200, 240, 256, 260, 263, 264, 265, 300) for b in (160, g) if b <= g]
    # "idle": 1 x 131072 32/32's planned grid, 32 heads x 34 chunk slots of which 16 busy, at most 4 or 5 CTAs an SM
    # (4 warps, shared memory padded), against the 512 busy CTAs alone
    period = 0
    if sys.argv[1:] == ["idle"]:
        runs, period = [(4, 16, 34 * 32, r) for r in (4, 5)] + [(4, 512, 512, r) for r in (4, 5)], 34
    if sys.argv[1:] == ["mha"]:
        # at most 4 (16 warps) or 2 (32 warps) a SM: a cap of 3 would pad past the 48 KB a launch may take unasked
        runs = [(w, b, s * h, 0, s) for w in (16, 32) for b, h, slots in ((8, 40, (28, 15, 11)), (32, 12, (89, 45, 34)))
                for s in slots]  # fmt: skip
    for warps, busy, grid, *cap in runs:
        # a run's own period (mha), else the mode's
        run_period = cap[1] if len(cap) > 1 else period
        if grid >= busy:
            rec = place(busy, grid, warps=warps, period=run_period if grid > busy else 0, per_sm=cap[0] if cap else 0)
            rec["warps"], rec["per_sm"] = warps, cap[0] if cap else None
            out.append(rec)
            print(f"warps {warps} at most {rec['per_sm']} a SM, busy {busy:4d} grid {grid:5d}: "
                  f"on {rec['sms_used']:3d} SMs, at most {rec['max_per_sm']} per SM "
                  f"(SMs with 0, 1, ... busy: {rec['sms_with']}); "
                  f"first SM ids {rec['first_ids'][:12]}", flush=True)  # fmt: skip
    with open(os.path.join(os.environ.get("OUT", "."), "dispatch.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
