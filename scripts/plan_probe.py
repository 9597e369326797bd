"""The planner kernel alone on the GPU: CUDA-graph µs of launch_plan for batches of 1-512 sequences, over chunk
slots per program and warps (``triton_splitk.planner_shape``). Writes $OUT/plan.jsonl, prints a table last.

    python scripts/plan_probe.py           # the shapes
    python scripts/plan_probe.py order     # without and with the dispatch order and equal chunks (PLANNER_ORDER,
                                           # PLANNER_EQUAL), at the rule's shape and wider ones
"""

import itertools
import random
import sys

import torch
from triton.testing import do_bench_cudagraph

from flashdecode import triton_splitk as sk
from flashdecode.bench import ProbeLog
from flashdecode.triton_common import Features

BATCHES = [([65536], 2), ([4096] * 16, 2), ([1024] * 64, 2), ([256] * 256, 2), ([2048] * 8, 4),
           ([131072] + [1024] * 63, 8), ([1024] * 512, 1)]  # fmt: skip
VARIANTS = list(itertools.product((64, 32, 16, 8, 4), (4, 2, 1)))


def main():
    log = ProbeLog("plan")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rule = sk.planner_shape
    for lens, hkv in BATCHES:
        seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        slots = sk.grid_chunks(len(lens), hkv, sms)
        num_cand = sk.num_candidates(max(lens), 64)
        ref = None
        res = {}
        for block_i, warps in VARIANTS:
            sk.planner_shape = lambda block_b, shape=(block_i, warps): shape

            def fn():
                return sk.launch_plan(seqlens, hkv, sms, slots, 64, num_cand, sk.SATURATION_PER_SM, False, Features())

            plan = fn()
            ref = plan if ref is None else ref
            # rows (seq, start, end) of the chunk slots, (first, count) of the sequences; the rest is never written
            assert torch.equal(plan[:3, :slots], ref[:3, :slots]) and torch.equal(plan[:2, slots:], ref[:2, slots:])
            res[f"{block_i}/{warps}"] = do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3
        name = f"{len(lens)}x{lens[-1]} Hkv{hkv}"
        best = min(res.items(), key=lambda kv: kv[1])
        log.row(dict(batch=name, slots=slots, **{k: round(v, 2) for k, v in res.items()}),
                f"{name:<20} slots {slots:>5}  64/4 {res['64/4']:>5.1f} us  best {best[1]:>5.1f} ({best[0]})  "
                + " ".join(f"{k}:{v:.1f}" for k, v in res.items()))  # fmt: skip
    sk.planner_shape = rule
    log.close()


def order():
    """The planner with the rule's shape in sequence order, then ordered with equal chunks at the rule's shape and at
    more warps and slots a program (uneven batches pay for the order in every program)."""
    g = random.Random(3)
    batches = [([131072] + [1024] * 63, 8), ([g.randint(100, 8000) for _ in range(200)], 2),
               ([g.randint(256, 2048) for _ in range(120)] + [g.randint(16384, 32768) for _ in range(8)], 8),
               ([g.randint(256, 16000) for _ in range(48)], 8), ([g.randint(1272, 7827) for _ in range(24)], 4),
               ([g.randint(500, 3000) for _ in range(512)], 8), ([1024] * 64, 2), ([256] * 256, 2)]  # fmt: skip
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rule = sk.planner_shape
    names = ["seq", "ordered", "x2 warps", "x4 warps", "x2 slots", "x4 slots"]
    print(f"{'batch':<22}{'shape':>8}" + "".join(f"{name:>10}" for name in names))
    for lens, hkv in batches:
        seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        slots = sk.grid_chunks(len(lens), hkv, sms)
        num_cand = sk.num_candidates(max(lens), 64)
        block_i, warps = rule(sk.next_power_of_2(len(lens)))
        shapes = [(block_i, warps), (block_i, warps), (block_i, min(4, 2 * warps)), (block_i, 4),
                  (min(64, 2 * block_i), 4), (min(64, 4 * block_i), 4)]  # fmt: skip
        times, ref = [], None
        for i, shape in enumerate(shapes):
            sk.PLANNER_ORDER = sk.PLANNER_EQUAL = i > 0
            sk.planner_shape = lambda block_b, shape=shape: shape

            def fn():
                return sk.launch_plan(seqlens, hkv, sms, slots, 64, num_cand, sk.SATURATION_PER_SM, False, Features())

            plan = fn()
            ref = plan if i == 1 else ref
            assert i < 2 or torch.equal(plan[:, :slots], ref[:, :slots])
            times.append(do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3)
        label = f"{len(lens)} x {min(lens)}..{max(lens)}"
        print(f"{label:<22}{f'{block_i}/{warps}':>8}" + "".join(f"{t:>10.2f}" for t in times), flush=True)
    sk.planner_shape = rule


if __name__ == "__main__":
    order() if sys.argv[1:] == ["order"] else main()
