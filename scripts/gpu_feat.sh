#!/usr/bin/env bash
# Issue 5 (model features) on the GPU: native tests, then the fp8 / window / head-dim benchmark rows.
#   OUT=/some/dir bash scripts/gpu_feat.sh        (from the repo root; ~4 minutes on one H200, at most ~6.5)
# Steps (each runs even if an earlier one failed):
#   1. make venv
#   2. the whole pytest suite natively (-n 8): the feature tests on the tensor-core / fp8 -> bf16 paths, the GPU-only
#      feature contracts (tests/test_gpu_features.py: graph replay with new fp8 scales and a window, no host sync,
#      window at 32k faster) and every earlier test (the default path must be unchanged)
#   3. flashdecode bench: presets dims (head_dim 64/128/256), ragged (regression), fp8 (bf16 vs e4m3 vs e5m2
#      cache), window (32k context, W = 4096 vs full); compared with the refactor-check results of commit de92a10
#   4. scripts/feat_configs.py: 4 vs 8 warps for the new large-row tiles (groups 64/128, q_len 8, head_dim 256)
# Results under $OUT: pytest.log, configs.log, bench.log, bench/ (results.json, results.md), summary.txt; the summary is
# printed last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
summary="$OUT/summary.txt"; : > "$summary"
note() { echo "$*" | tee -a "$summary"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$summary"
note "commit $(git rev-parse --short HEAD 2>/dev/null || echo "${FLASHDECODE_COMMIT:-unknown}")"
make venv > "$OUT/venv.log" 2>&1; note "make venv: exit $?"

start=$(date +%s)
timeout 160 .venv/bin/python -m pytest -q -n 8 -p no:cacheprovider -rs tests > "$OUT/pytest.log" 2>&1
rc=$?
note "pytest native (all tests, -n 8): exit $rc, $(tail -1 "$OUT/pytest.log") in $(( $(date +%s) - start ))s"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20 | tee -a "$summary"

start=$(date +%s)
timeout 120 .venv/bin/python -m flashdecode bench --no-progress --preset dims,ragged,fp8,window \
  --backends auto,triton,triton_splitk --out "$OUT/bench" \
  --compare docs/benchmarks/h200-2026-11-22/refactor-check/results.json > "$OUT/bench.log" 2>&1
note "bench: exit $? in $(( $(date +%s) - start ))s"

start=$(date +%s)
timeout 90 .venv/bin/python scripts/feat_configs.py > "$OUT/configs.log" 2>&1
note "launch-table check (4 vs 8 warps on large-row tiles): exit $? in $(( $(date +%s) - start ))s"
cat "$OUT/configs.log" | tee -a "$summary"

# the rows: graph µs per backend, GB/s (bytes: fp8 = 1 byte per element; window = only the window's tokens)
.venv/bin/python - "$OUT/bench/results.json" <<'PY' 2>&1 | tee -a "$summary"
import json, sys
try:
    res = json.load(open(sys.argv[1]))["results"]
except Exception as e:
    sys.exit(f"no bench results: {e}")
print(f"{'row':44} {'backend':14} {'graph us':>9} {'GB/s':>6} status")
for r in res:
    us = r.get("graph_us")
    print(f"{r['row'][:44]:44} {r['backend']:14} {us if us is None else round(us, 1)!s:>9} "
          f"{round(r['gbps']) if r.get('gbps') else '-'!s:>6} {r['status']} {r.get('reason', '')[:40]}")
rows = {(r["row"], r["backend"]): r.get("graph_us") for r in res}
for b in ("auto", "triton_splitk", "triton"):
    for n in (1, 16):
        full, win = rows.get((f"{n}x32768 32/8", b)), rows.get((f"{n}x32768 32/8 W4096", b))
        if full and win:
            print(f"window speed-up {n}x32768 W4096 {b}: {full:.1f} -> {win:.1f} us ({full / win:.2f}x)")
PY
note "--- compare with refactor-check (de92a10): rows more than 5% slower ---"
grep -E "^SLOWER|^no row more" "$OUT/bench.log" | head -20 | tee -a "$summary"
echo "=== summary ==="; cat "$summary"
