#!/bin/bash
# The anchor grid with every peer, caches rotated, then its four rows under PERF.md's 60 MB L2 (the 28/4 rows) with
# every peer and the caches warm (`bench --warm-l2`, twice), as PERF.md timed them; the report's last line is the
# geomean against PERF.md with each row timed in PERF.md's condition (anchor_report.py --warm):
#   bash scripts/gpu_warm.sh COMMIT [PREVIOUS_ANCHOR_RESULTS]
source scripts/gpu_env.sh > $OUT/env.log 2>&1
export FLASHDECODE_COMMIT=${1:?usage: gpu_warm.sh COMMIT [PREVIOUS_ANCHOR_RESULTS]}
echo $1 > $OUT/commit.txt
previous=${2:-docs/benchmarks/h200-2026-11-28/anchor-c38becc/anchor/results.json}
peers=auto,auto_plan,flashinfer,flashinfer_tc,sglang_triton,vllm_triton
.venv/bin/python -m flashdecode bench --preset anchor --backends $peers --no-progress --out $OUT/anchor \
  --compare $previous > $OUT/anchor.log 2>&1
echo "anchor exit $? ${SECONDS}s"
for i in 1 2; do
  .venv/bin/python -m flashdecode bench --batch 1,8 --seqlen 128,2048 --heads 28/4 --warm-l2 --backends $peers \
    --no-progress --out $OUT/warm-$i > $OUT/warm-$i.log 2>&1
  echo "warm $i exit $? ${SECONDS}s"
done
for i in 1 2; do
  .venv/bin/python scripts/anchor_report.py $OUT/anchor/results.json $previous --ours auto_plan \
    --warm $OUT/warm-$i/results.json --floor 4400,3.7 > $OUT/report-plan-$i.md
done
.venv/bin/python scripts/anchor_report.py $OUT/anchor/results.json --ours auto > $OUT/report-auto.md
rm -f $OUT/*/*.png
# at most 8 files come back from the device: the result folders and the warm logs travel as one archive
tar -czf $OUT/results.tar.gz -C $OUT anchor warm-1 warm-2 warm-1.log warm-2.log && rm -rf $OUT/anchor $OUT/warm-?{,.log}
grep -h -A8 "^Warm L2" $OUT/report-plan-*.md
grep -h "geomean\|In PERF.md's conditions" $OUT/report-plan-*.md $OUT/report-auto.md
