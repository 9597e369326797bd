#!/usr/bin/env bash
# Reliability checks on one GPU (issue 7, docs/contracts.md). From the repo root, after `make venv`:
#   OUT=/some/dir bash scripts/gpu_rel.sh                    # all steps, about 3 minutes on an H200 (at most ~5.5)
#   OUT=/some/dir bash scripts/gpu_rel.sh "pool repeat"      # some steps
# Steps (each bounded by `timeout`; a failing step does not stop the others):
#   warm       scripts/sanitize_cases.py plainly: compiles the kernels into TRITON_CACHE_DIR, checks every result
#   memcheck   the same cases under compute-sanitizer --tool memcheck, every tensor its own cudaMalloc
#   racecheck  the split-K cases (partials + combine) under compute-sanitizer --tool racecheck
#   initcheck  (not in the default list) the split-K cases under --tool initcheck: no read of unwritten memory
#   pool       K/V pools of > 2^31 elements each, sequences' pages near the end (scripts/gpu_rel_checks.py pool)
#   repeat     1000 calls per backend bit-identical (scripts/gpu_rel_checks.py repeat)
# Writes $OUT/<step>.log, $OUT/env.txt and $OUT/summary.txt (7 files); prints the summary table last.
set -uo pipefail
cd "$(dirname "$0")/.."
steps=${1:-"warm memcheck racecheck pool repeat"}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/flashdecode-triton-cache}
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || make venv >/dev/null 2>&1 || PY=python3

# compute-sanitizer: on PATH, in a CUDA toolkit, or in the nvidia pip packages next to torch
SAN=$(command -v compute-sanitizer || true)
if [ -z "$SAN" ]; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/nvidia/*/bin; do
    [ -x "$d/compute-sanitizer" ] && SAN="$d/compute-sanitizer" && break
  done
fi
if [ -z "$SAN" ]; then
  nv=$("$PY" -c "import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))" 2>/dev/null || true)
  [ -n "$nv" ] && SAN=$(find "$nv/nvidia" -name compute-sanitizer -type f -perm -u+x 2>/dev/null | head -1)
fi

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo "${FLASHDECODE_COMMIT:-unknown}")"
  echo "compute-sanitizer: ${SAN:-not found}"; [ -n "$SAN" ] && "$SAN" --version | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

summary="$OUT/summary.txt"
printf "%-10s %-8s %6s  %s\n" step result seconds detail > "$summary"

# run_step NAME TIMEOUT_S COMMAND...: log to $OUT/NAME.log, one summary row
run_step() {
  local name=$1 limit=$2; shift 2
  local start rc result detail
  start=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  case $rc in
    0) result=PASS ;;
    124) result=TIMEOUT ;;
    *) result="FAIL($rc)" ;;
  esac
  # the sanitizer's verdict, else the script's RESULT line, else the last line
  detail=$(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT/$name.log" | sort | uniq -c | tr -s ' ' | paste -sd';' -)
  [ -z "$detail" ] && detail=$(grep -h "^RESULT" "$OUT/$name.log" | tail -1)
  [ -z "$detail" ] && detail=$(tail -1 "$OUT/$name.log" | cut -c1-160)
  printf "%-10s %-8s %6s  %s\n" "$name" "$result" "$(( $(date +%s) - start ))" "$detail" | tee -a "$summary"
}

SPLITK_CASES="splitk-fixed3 splitk-planned-ragged splitk-fixed24"
for step in $steps; do
  case $step in
    warm) run_step warm 120 "$PY" scripts/sanitize_cases.py ;;
    memcheck|racecheck|initcheck)
      if [ -z "$SAN" ]; then
        printf "%-10s %-8s %6s  %s\n" "$step" SKIPPED 0 "compute-sanitizer not found" | tee -a "$summary"; continue
      fi
      # every tensor its own allocation, so that a read past one is outside any allocation
      if [ "$step" = memcheck ]; then
        run_step memcheck 120 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SAN" --tool memcheck --report-api-errors no \
          --error-exitcode 99 --print-limit 40 "$PY" scripts/sanitize_cases.py
      else
        run_step "$step" 90 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SAN" --tool "$step" --report-api-errors no \
          --error-exitcode 99 --print-limit 40 "$PY" scripts/sanitize_cases.py --only $SPLITK_CASES
      fi ;;
    pool) run_step pool 60 "$PY" scripts/gpu_rel_checks.py pool ;;
    repeat) run_step repeat 60 "$PY" scripts/gpu_rel_checks.py repeat ;;
    *) echo "unknown step $step" ;;
  esac
done
echo
cat "$summary"
