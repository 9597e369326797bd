#!/bin/bash
# Probe: a chained single pass asks L2 for its first tokens' K/V before its PDL wait, and optionally lets the next
# call launch a few tiles before its walk ends (FLASHDECODE_PRE_WAIT="T[,k]", triton_single.PRE_WAIT_TOKENS), on the
# anchor grid, the plan alone, one process per variant:
#   bash scripts/gpu_pre_wait.sh COMMIT
source scripts/gpu_env.sh > $OUT/env.log 2>&1
export FLASHDECODE_COMMIT=${1:?usage: gpu_pre_wait.sh COMMIT}
echo $1 > $OUT/commit.txt
runs=""; args=""
for v in 0 64 64,3 0 128,6 64,3; do
  [ $SECONDS -gt 470 ] && { echo "variant $v skipped at ${SECONDS}s"; continue; }
  name=pw-${v/,/-}; [ -d $OUT/$name ] && name=$name-b
  FLASHDECODE_PRE_WAIT=$v .venv/bin/python -m flashdecode bench --preset anchor --backends auto_plan \
    --no-progress --out $OUT/$name > $OUT/$name.log 2>&1
  echo "variant $v exit $? ${SECONDS}s"
  runs="$runs $name"; args="$args ${name#pw-}=$OUT/$name/results.json"
done
rm -f $OUT/*/*.png
.venv/bin/python scripts/ab_table.py $args > $OUT/ab.txt
logs=$(for r in $runs; do echo $r.log; done)
tar -czf $OUT/results.tar.gz -C $OUT $runs $logs && rm -rf $OUT/pw-*
cat $OUT/ab.txt
