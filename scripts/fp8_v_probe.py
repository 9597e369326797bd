"""fp8 rows with the V tile converted in registers and read by the dot as fp16 from shared memory
(``triton_common.FP8_V_F16_SHARED``, the default) or converted in the dot's operand layout (one-byte shared loads):
`auto` and the plan, checked against the float64 reference, CUDA-graph medians with the caches rotated out of L2.
The switch is read at import, so each setting runs in its own process:

    FLASHDECODE_FP8_V_F16=1 python scripts/fp8_v_probe.py run on.jsonl
    FLASHDECODE_FP8_V_F16=0 python scripts/fp8_v_probe.py run off.jsonl
    python scripts/fp8_v_probe.py compare off.jsonl on.jsonl [off-again.jsonl]
"""

import json
import sys

from flashdecode.bench import Row, run_rows

# bf16 first: the fp8 target is a ratio to it (../shared/PERF.md: fp8 KV >= 1.8x faster than bf16 on large rows)
ROWS = [
    Row([4096] * 64, 32, 8, kv_dtype=kv) for kv in ("", "e4m3", "e5m2")
] + [Row([131072], 32, 8)] + [
    Row(lens, hq, hkv, kv_dtype="e4m3")
    for lens, hq, hkv in (
        ([4096] * 48, 32, 8), ([4096] * 16, 32, 8), ([131072], 32, 8), ([16384] * 4, 32, 8), ([8192] * 8, 32, 8),
        ([2048] * 40, 32, 8), ([131072] + [1024] * 63, 32, 8), ([65536], 12, 2), ([131072], 12, 2),
        ([4096] * 16, 12, 2), ([1024] * 64, 12, 2), ([1024] * 32, 12, 2), ([2048] * 8, 28, 4), ([2048], 28, 4),
        ([128] * 8, 28, 4), ([8192], 28, 4), ([4096] * 8, 64, 8), ([8192] * 8, 32, 16), ([4096] * 16, 12, 12),
    )
] + [Row([4096] * 64, 32, 8, head_dim=d, kv_dtype="e4m3") for d in (64, 256)]  # fmt: skip


def main():
    mode, *paths = sys.argv[1:]
    if mode == "run":
        with open(paths[0], "w") as f:
            for rec in run_rows(ROWS, ["auto", "auto_plan"], "cuda", progress=False):
                f.write(json.dumps(rec) + "\n")
                print(rec["row"], rec["backend"], rec.get("graph_us"), rec.get("status"), flush=True)
        return
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append({(r["row"], r["backend"]): r.get("graph_us") for r in map(json.loads, f)})
    print("| row | backend | " + " | ".join(paths) + " |")
    print("|---|---|" + "---:|" * len(paths))
    for key in runs[0]:
        cells = [f"{run.get(key):.1f}" if run.get(key) else "-" for run in runs]
        print(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
