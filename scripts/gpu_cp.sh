#!/usr/bin/env bash
# Context-parallel decode on the GPUs of one host (issue 8): tests natively, then the benchmark on 1, 2 and 4 GPUs
# (as many as are visible). Run from the repo root; logs and results go under $OUT:
#   FLASHDECODE_COMMIT=<sha> OUT=/some/dir bash scripts/gpu_cp.sh    # "test bench": ~4-5 min on 4 H200s, at most 9
#   OUT=/some/dir bash scripts/gpu_cp.sh bench        # benchmark only: ~3 min, at most 6 (timeouts 120 s per N)
# Files under $OUT: pytest-distributed.log, cp-N{1,2,4}.log, results.json (every rank's numbers), results.md.
set -uo pipefail
steps=${1:-"test bench"}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# NVLink multicast (NVLS) off, as on the lent machines
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
make venv 2>&1 | tail -2
PY=.venv/bin/python
export FLASHDECODE_COMMIT=${FLASHDECODE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
echo "commit $FLASHDECODE_COMMIT"
ngpu=$($PY -c "import torch; print(torch.cuda.device_count())")
echo "$ngpu GPUs visible"
for step in $steps; do
  case $step in
    test)
      # gloo on the CPU (world 2 and 3) and, with 2 GPUs, NCCL with the native Triton kernels
      start=$(date +%s)
      timeout 180 $PY -m pytest -q -p no:cacheprovider tests/test_distributed.py > "$OUT/pytest-distributed.log" 2>&1
      echo "pytest tests/test_distributed.py: exit $?, $(tail -1 "$OUT/pytest-distributed.log") in $(( $(date +%s) - start ))s"
      grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/pytest-distributed.log" | head -10 ;;
    bench)
      for n in 1 2 4; do
        if [ "$n" -gt "$ngpu" ]; then echo "N=$n: skipped, $ngpu GPUs"; continue; fi
        start=$(date +%s)
        timeout 120 $PY -m torch.distributed.run --standalone --nproc_per_node "$n" scripts/bench_cp.py --out "$OUT" \
          > "$OUT/cp-N$n.log" 2>&1
        echo "N=$n: exit $? in $(( $(date +%s) - start ))s"
        grep "^\[rank" "$OUT/cp-N$n.log" | tail -14
      done
      # results.json holds every run's per-rank records, so the per-run files can go (at most 8 files come back)
      $PY scripts/bench_cp.py --summarize "$OUT" && rm -f "$OUT"/cp-N*.json ;;
  esac
done
