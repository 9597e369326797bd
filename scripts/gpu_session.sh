#!/usr/bin/env bash
# One device-machine session: set up, test natively, run, benchmark. Logs and results go under $OUT.
#   bash scripts/gpu_session.sh "test run bench" [bench args...]
# Steps: test = the pytest suite natively; run = `make run`; bench = `flashdecode bench` with the given args.
set -uo pipefail
steps=${1:-"test run bench"}; shift || true
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_env.sh
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit"
for step in $steps; do
  case $step in
    test)
      start=$(date +%s)
      .venv/bin/python -m pytest -q -n 8 -p no:cacheprovider tests > "$OUT/pytest.log" 2>&1
      echo "pytest (native GPU): $(tail -1 "$OUT/pytest.log") in $(( $(date +%s) - start ))s"
      grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20 ;;
    run)
      .venv/bin/python -m flashdecode run > "$OUT/run.log" 2>&1; echo "make run exit $?"; tail -12 "$OUT/run.log" ;;
    bench)
      .venv/bin/python -m flashdecode bench --no-progress --out "$OUT/bench" "$@" > "$OUT/bench.log" 2>&1
      echo "bench exit $?"; grep -v "^\s*$" "$OUT/bench.log" | tail -60 ;;
  esac
done
