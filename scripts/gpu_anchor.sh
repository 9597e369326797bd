#!/bin/bash
# Native GPU suite, dispatch probe, anchor with every peer against an earlier anchor run:
#   bash scripts/gpu_anchor.sh <commit> [previous results.json]
# The commit comes from the caller: the device machine's .git copy may be older than the tree it runs.
source scripts/gpu_env.sh > $OUT/env.log 2>&1
export FLASHDECODE_COMMIT=${1:?usage: gpu_anchor.sh COMMIT [PREVIOUS_RESULTS]}
previous=${2:-docs/benchmarks/h200-2026-11-23/anchor-5075013/results.json}
start=$SECONDS
.venv/bin/python -m pytest -q -n 8 -p no:cacheprovider tests > $OUT/pytest.log 2>&1
echo "pytest: $(tail -1 $OUT/pytest.log) $((SECONDS-start))s"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head
.venv/bin/python scripts/dispatch_probe.py idle > $OUT/dispatch-idle.log 2>&1; cat $OUT/dispatch-idle.log | cut -c1-150
.venv/bin/python -m flashdecode bench --preset anchor,ragged,dims --backends auto,auto_plan,flashinfer,flashinfer_tc,sglang_triton,vllm_triton --no-progress --out $OUT/anchor --compare $previous > $OUT/anchor.log 2>&1
echo "bench exit $? $((SECONDS-start))s"; grep -A30 -i "slower" $OUT/anchor.log | head -30
.venv/bin/python scripts/anchor_report.py $OUT/anchor/results.json --ours auto_plan > $OUT/report-plan.md
.venv/bin/python scripts/anchor_report.py $OUT/anchor/results.json --ours auto > $OUT/report-auto.md
grep -i "geomean" $OUT/report-plan.md $OUT/report-auto.md
rm -f $OUT/anchor/*.png
