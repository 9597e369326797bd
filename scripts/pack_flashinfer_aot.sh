#!/usr/bin/env bash
# Packs the FlashInfer kernels JIT-built in this GPU session (FLASHINFER_WORKSPACE_BASE, set by gpu_env.sh) as a
# tarball in FlashInfer's prebuilt ("AOT") layout, flashinfer/data/aot/<uri>/<uri>.so. Copied back into .whl/,
# gpu_env.sh unpacks it next to the installed package, and the next fresh machine skips the ~1 min of JIT builds.
# Usage: scripts/pack_flashinfer_aot.sh OUT_TARBALL
set -euo pipefail
out=$1
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
find "${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}" -name '*.so' | while read -r so; do
  uri=$(basename "$(dirname "$so")")
  [ "$(basename "$so")" = "$uri.so" ] || continue
  mkdir -p "$stage/flashinfer/data/aot/$uri" && cp "$so" "$stage/flashinfer/data/aot/$uri/"
done
tar -czf "$out" -C "$stage" flashinfer
tar -tzf "$out"
