#!/bin/bash
# The plan's fixed splits of a set of rows, timed twice with the combine launch and merged in the last split program
# (scripts/fused_fixed_probe.py --plan-only), then, for the mha set, the native suite:
#   bash scripts/gpu_fused_rows.sh mha|sg COMMIT
# mha: MHA-tile and small-group rows the plan merged with the combine launch (S 4-8, B * Hq < #SMs; run at a048844,
# h200-2026-11-28/mha-fused-a048844); sg: small-group rows it merges in the last program (S 2-4, B * Hq >= #SMs; run
# at 03edd4c, fused-sg-03edd4c)
set=${1:?usage: gpu_fused_rows.sh mha|sg COMMIT}
source scripts/gpu_env.sh > $OUT/env.log 2>&1; export FLASHDECODE_COMMIT=${2:?usage: gpu_fused_rows.sh mha|sg COMMIT}
echo $2 > $OUT/commit.txt
case $set in
  mha) rows="2,8192,32,32 2,32768,32,32 3,8192,32,32 4,8192,32,32 4,16384,12,12 3,16384,12,12 6,8192,12,12
             8,8192,12,12 1,8192,40,40 2,8192,40,40 3,8192,40,40 8,8192,8,8 6,8192,8,8 4,8192,32,16 3,8192,32,16
             2,8192,64,64 1,8192,64,64 2,2048,32,32 4,2048,12,12" ;;
  sg) rows="6,8192,32,32 8,8192,32,32 8,4096,32,32 6,32768,32,32 8,2048,32,32 5,8192,32,32 6,8192,32,16 8,8192,32,16
            3,8192,64,64 4,8192,64,64 16,4096,16,16 12,8192,16,16 24,4096,8,8 32,4096,8,8" ;;
  *) echo "unknown set $set"; exit 2 ;;
esac
R=""; for r in $rows; do R="$R --row $r"; done
for i in 1 2; do
  timeout 200 .venv/bin/python scripts/fused_fixed_probe.py --plan-only $R > $OUT/fused-$i.log 2>&1
  echo "probe $i rc $? ${SECONDS}s"
done
if [ $set = mha ]; then
  timeout 280 .venv/bin/python -m pytest -q -n 8 -p no:cacheprovider tests > $OUT/pytest.log 2>&1
  echo "pytest: $(tail -1 $OUT/pytest.log) ${SECONDS}s"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head
fi
# the two runs side by side: row, variant, µs (first run), µs (second run)
paste <(awk '{print $1, $2, $3, $4, $5}' $OUT/fused-1.log) <(awk '{print $5}' $OUT/fused-2.log)
