#!/bin/bash
# Fixed splits of MHA-tile rows (groups < 4) whose plan merges by the combine launch (S 4-8, B * Hq < #SMs): the
# same S merged in the last split program instead, twice; then the native suite. bash scripts/gpu_fused_mha.sh COMMIT
source scripts/gpu_env.sh > $OUT/env.log 2>&1; export FLASHDECODE_COMMIT=${1:?usage: gpu_fused_mha.sh COMMIT}; echo $1 > $OUT/commit.txt
R=""; for r in 2,8192,32,32 2,32768,32,32 3,8192,32,32 4,8192,32,32 4,16384,12,12 3,16384,12,12 6,8192,12,12 8,8192,12,12 1,8192,40,40 2,8192,40,40 3,8192,40,40 8,8192,8,8 6,8192,8,8 4,8192,32,16 3,8192,32,16 2,8192,64,64 1,8192,64,64 2,2048,32,32 4,2048,12,12; do R="$R --row $r"; done
for i in 1 2; do timeout 200 .venv/bin/python scripts/fused_fixed_probe.py --plan-only $R > $OUT/fused-$i.log 2>&1; echo "probe $i rc $? ${SECONDS}s"; done
timeout 280 .venv/bin/python -m pytest -q -n 8 -p no:cacheprovider tests > $OUT/pytest.log 2>&1; echo "pytest: $(tail -1 $OUT/pytest.log) ${SECONDS}s"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head
paste <(awk "{print \$1,\$2,\$3,\$4,\$5}" $OUT/fused-1.log) <(awk "{print \$5}" $OUT/fused-2.log) | column -t
