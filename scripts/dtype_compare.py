"""fp16 against bf16: graph µs of each row and backend in two ``flashdecode bench`` results.json of one session
(``--dtype bf16`` and ``--dtype fp16``), their ratio, and its range and geometric mean per backend.

    python scripts/dtype_compare.py BF16/results.json FP16/results.json
"""

import json
import math
import sys


def graph_us(path):
    with open(path) as f:
        results = json.load(f)["results"]
    # a non-default dtype names itself in the row: "256x256 12/12 D128 P16 fp16"
    names = {r["row"]: r["row"].replace(" D128 P16 fp16", "").replace(" D128 P16 bf16", "") for r in results}
    return {(names[r["row"]], r["backend"]): r["graph_us"] for r in results if r.get("status") == "ok"}


def main():
    bf16, fp16 = graph_us(sys.argv[1]), graph_us(sys.argv[2])
    ratios = {}
    for key in bf16:
        if key in fp16:
            ratio = fp16[key] / bf16[key]
            ratios.setdefault(key[1], []).append(ratio)
            print(f"{key[0]:34s} {key[1]:10s} bf16 {bf16[key]:8.2f} fp16 {fp16[key]:8.2f} {ratio:.3f}")
    for backend, rs in ratios.items():
        mean = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"{backend}: fp16 / bf16 {min(rs):.3f}-{max(rs):.3f}, geometric mean {mean:.3f} over {len(rs)} rows")


if __name__ == "__main__":
    main()
