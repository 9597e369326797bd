#!/bin/bash
# The max fixed at each row's first tile (triton_common.FIXED_MAX) A/B on the anchor grid: the plan and `auto` with
# FLASHDECODE_FIXED_MAX 0 (the library), 1 (fixed, walked again when a row's scores rise too far) and 2 (fixed, no
# second walk: probe only), in the order 0 1 2 0 1, one process each; before it scripts/fixed_max_check.py:
#   bash scripts/gpu_fixed_max.sh COMMIT
source scripts/gpu_env.sh > $OUT/env.log 2>&1
export FLASHDECODE_COMMIT=${1:?usage: gpu_fixed_max.sh COMMIT}
echo $1 > $OUT/commit.txt
for v in 1 2; do
  FLASHDECODE_FIXED_MAX=$v .venv/bin/python scripts/fixed_max_check.py cuda > $OUT/check-$v.log 2>&1
  echo "check $v: $(tail -1 $OUT/check-$v.log) ${SECONDS}s"
done
runs=""
for run in 0a 1a 2a 0b 1b; do
  # the device call's 600 s: no run started after 440 s
  [ $SECONDS -gt 440 ] && { echo "bench $run skipped at ${SECONDS}s"; continue; }
  runs="$runs fm-$run"
  FLASHDECODE_FIXED_MAX=${run:0:1} .venv/bin/python -m flashdecode bench --preset anchor --backends auto_plan,auto \
    --no-progress --out $OUT/fm-$run > $OUT/fm-$run.log 2>&1
  echo "bench $run exit $? ${SECONDS}s"
done
rm -f $OUT/*/*.png
names=(base fixed nowalk base2 fixed2)
args=""; i=0
for r in $runs; do args="$args ${names[$i]}=$OUT/$r/results.json"; i=$((i + 1)); done
.venv/bin/python scripts/ab_table.py $args > $OUT/ab.txt
tar -czf $OUT/results.tar.gz -C $OUT $runs && rm -rf $OUT/fm-??
cat $OUT/ab.txt
