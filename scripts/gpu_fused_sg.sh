#!/bin/bash
# Fixed splits of small-group rows (groups 1-2 with a power-of-two token row) that the plan merges in the last split
# program (S 2-4, B * Hq >= #SMs): the same S with the combine launch instead, twice. bash scripts/gpu_fused_sg.sh COMMIT
source scripts/gpu_env.sh > $OUT/env.log 2>&1; export FLASHDECODE_COMMIT=${1:?usage: gpu_fused_sg.sh COMMIT}; echo $1 > $OUT/commit.txt
R=""; for r in 6,8192,32,32 8,8192,32,32 8,4096,32,32 6,32768,32,32 8,2048,32,32 5,8192,32,32 6,8192,32,16 8,8192,32,16 3,8192,64,64 4,8192,64,64 16,4096,16,16 12,8192,16,16 24,4096,8,8 32,4096,8,8; do R="$R --row $r"; done
for i in 1 2; do timeout 200 .venv/bin/python scripts/fused_fixed_probe.py --plan-only $R > $OUT/fused-$i.log 2>&1; echo "probe $i rc $? ${SECONDS}s"; done
paste <(awk "{print \$1,\$2,\$3,\$4,\$5,\$6}" $OUT/fused-1.log) <(awk "{print \$5}" $OUT/fused-2.log)
