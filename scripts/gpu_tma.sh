#!/usr/bin/env bash
# triton_tma on the GPU: native tests, launch-parameter sweep, anchor benchmark. Logs and results go under $OUT.
#   OUT=/some/dir bash scripts/gpu_tma.sh [steps]       (from the repo root; default steps: "test sweep bench")
# Steps: test = the whole suite natively (the TMA tests, the CUDA-graph / no-sync tests with triton_tma, and the
# split-K kernels whose helpers triton_tma now shares); sweep = scripts/sweep_tma.py over four anchor rows;
# bench = the anchor preset for triton, triton_splitk, triton_tma, auto and FlashInfer. Each step has its own time
# cap (about 6 minutes in all); one failing step does not stop the others. The summary table comes last.
set -uo pipefail
steps=${1:-"test sweep bench"}
OUT=${OUT:-/tmp/out}
# logs and results are collected in $OUT/tma and tarred at the end (few files come back from the device machine)
W="$OUT/tma"; mkdir -p "$W"
source scripts/gpu_env.sh
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "${FLASHDECODE_COMMIT:-unknown}")
echo "commit $commit"
declare -A status
for step in $steps; do
  start=$(date +%s)
  case $step in
    test)
      timeout 100 .venv/bin/python -m pytest -q -n 8 -p no:cacheprovider tests > "$W/pytest.log" 2>&1
      rc=$?
      status[test]="rc $rc: $(tail -1 "$W/pytest.log")"
      grep -E "^(FAILED|ERROR)" "$W/pytest.log" | head -20 ;;
    sweep)
      OUT=$W timeout 130 .venv/bin/python scripts/sweep_tma.py > "$W/sweep_tma.log" 2>&1
      rc=$?
      status[sweep]="rc $rc: $(grep -c '"kind"' "$W/sweep_tma.log") configs timed or failed" ;;
    bench)
      timeout 200 .venv/bin/python -m flashdecode bench --preset anchor \
        --backends triton,triton_splitk,triton_tma,auto,flashinfer,flashinfer_tc --no-progress --out "$W/bench" \
        > "$W/bench.log" 2>&1
      rc=$?
      status[bench]="rc $rc (results.json is saved after every row, so a cut-short run keeps its rows)" ;;
    *) echo "unknown step $step"; continue ;;
  esac
  echo "$step: ${status[$step]} in $(( $(date +%s) - start ))s"
done

# compact summary: the sweep's best config per row, then triton_tma next to the others on the anchor grid
.venv/bin/python - "$W" <<'PY' 2>&1 | tee "$W/summary.txt"
import json, os, sys
out = sys.argv[1]
sweep = os.path.join(out, "sweep_tma.log")
if os.path.exists(sweep):
    best = [json.loads(l[5:]) for l in open(sweep) if l.startswith("BEST ")]
    failed = [json.loads(l) for l in open(sweep) if l.startswith("{") and "error" in l]
    print("sweep (graph us): row | triton | triton_splitk | best triton_tma [PAGES_PER_TILE stages warps PPSM]")
    for r in (best[0] if best else []):
        b = r.get("best_tma") or {}
        cfg = " ".join(str(b.get(k)) for k in ("PAGES_PER_TILE", "num_stages", "num_warps", "PROGRAMS_PER_SM"))
        print(f"  {r['row']:<20} {r.get('triton_us')!s:>8} {r.get('triton_splitk_us')!s:>8} {b.get('us')!s:>8} [{cfg}]")
    for f in failed[:8]:
        print("  failed:", f["row"], f["kind"], f.get("PAGES_PER_TILE"), f.get("num_stages"), f.get("num_warps"), f["error"][:120])
res = os.path.join(out, "bench", "results.json")
if os.path.exists(res):
    rows = {}
    for r in json.load(open(res))["results"]:
        rows.setdefault(r["row"], {})[r["backend"]] = r.get("graph_us") if r.get("status") == "ok" else r.get("status")
    cols = ["triton", "triton_splitk", "triton_tma", "auto", "flashinfer", "flashinfer_tc"]
    print("anchor (graph us): row | " + " | ".join(cols) + " | tma/splitk | tma/best FI")
    for name, b in rows.items():
        f = lambda v: f"{v:8.1f}" if isinstance(v, float) else f"{str(v):>8}"
        fi = [v for v in (b.get("flashinfer"), b.get("flashinfer_tc")) if isinstance(v, float)]
        tma, sk = b.get("triton_tma"), b.get("triton_splitk")
        r1 = f"{tma / sk:.2f}" if isinstance(tma, float) and isinstance(sk, float) else "-"
        r2 = f"{tma / min(fi):.2f}" if isinstance(tma, float) and fi else "-"
        print(f"  {name:<22} " + " ".join(f(b.get(c)) for c in cols) + f"  {r1:>6}  {r2:>6}")
PY
cp "$W/summary.txt" "$OUT/summary.txt"
[ -f "$W/bench/results.json" ] && cp "$W/bench/results.json" "$OUT/bench-results.json"
tar -czf "$OUT/tma-gpu.tar.gz" -C "$OUT" tma && rm -rf "$W"
ls "$OUT"
