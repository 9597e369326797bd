#!/usr/bin/env bash
# Serving integration on the GPU (issue 6): about 4 minutes on one H200, 6 at most (step limits 120 + 200 + 40 s).
# Run from the repo root after `make venv`:
#   OUT=/path/to/out bash scripts/gpu_serve.sh
# Steps (each runs even if an earlier one failed; each has its own time limit):
#   1. pytest, natively: append_kv, PagedKVCache, custom ops (incl. torch.compile fullgraph), the transformers loop,
#      and tests/test_gpu_serving.py (custom ops in a CUDA graph captured short / replayed long, no host sync,
#      the loop with its captured decode step equal to generate()).
#   2. scripts/serve_bench.py: Llama-3-8B-shaped model, random bf16 weights, batch 1 / 8 / 64, prompt 128, 64 new
#      tokens: tokens vs generate() up to each sequence's first near-tie (sequences that break it are listed), the
#      same rule for generate() with eager attention as a control, decode tokens/s vs generate() with SDPA.
#   3. the CPU example (tiny model, checks itself against generate()).
# Overrides (for a dry run on a CPU machine): BENCH_ARGS (default: the H200 sizes), WORKERS (pytest-xdist, 4).
# Files under $OUT (7): env.txt pytest-serving.log bench.log results.json results.md example-cpu.log summary.txt
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=.venv/bin/python
[ -x "$PY" ] || make venv > "$OUT/env.txt" 2>&1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "commit ${FLASHDECODE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  "$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} >> "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

declare -A status seconds
step() {  # step NAME LIMIT_S LOG COMMAND...
  local name=$1 limit=$2 log=$3; shift 3
  local start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  seconds[$name]=$(( $(date +%s) - start ))
  status[$name]=$([ $rc -eq 0 ] && echo ok || ([ $rc -eq 124 ] && echo "TIMEOUT" || echo "FAILED rc=$rc"))
  echo "== $name: ${status[$name]} in ${seconds[$name]}s"
}

BENCH_ARGS=${BENCH_ARGS:-"--batches 1 8 64 --prompt-len 128 --new-tokens 64"}
step pytest 120 "$OUT/pytest-serving.log" "$PY" -m pytest -q -n "${WORKERS:-4}" -p no:cacheprovider \
  tests/test_append.py tests/test_cache.py tests/test_ops.py tests/test_transformers.py tests/test_gpu_serving.py
tail -1 "$OUT/pytest-serving.log"; grep -E "^(FAILED|ERROR)" "$OUT/pytest-serving.log" | head -20

# shellcheck disable=SC2086
step bench 200 "$OUT/bench.log" "$PY" scripts/serve_bench.py --out "$OUT" $BENCH_ARGS
grep -E "^(model built|batch|  )" "$OUT/bench.log" | head -60; grep -E "Error|error" "$OUT/bench.log" | tail -5

step example-cpu 40 "$OUT/example-cpu.log" env CUDA_VISIBLE_DEVICES= "$PY" examples/generate_tiny_cpu.py
grep -v Warning "$OUT/example-cpu.log" | tail -5

{
  echo "| step | status | seconds |"
  echo "|---|---|---:|"
  for name in pytest bench example-cpu; do echo "| $name | ${status[$name]} | ${seconds[$name]} |"; done
  echo
  echo "pytest: $(tail -1 "$OUT/pytest-serving.log")"
  [ -f "$OUT/results.md" ] && sed -n '/^| batch/,/^$/p' "$OUT/results.md" && grep -c "^- batch" "$OUT/results.md" \
    | sed 's/^/rule-breaking sequences listed in results.md (ours and control): /'
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"
