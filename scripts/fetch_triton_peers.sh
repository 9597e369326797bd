#!/usr/bin/env bash
# Fetches the Triton decode kernels of SGLang and vLLM for the benchmark's sglang_triton / vllm_triton peers:
# downloads the two wheels (no dependencies) and keeps only the kernel files, under .whl/peers/ (git-ignored,
# carried to the GPU machine with `carry: [".whl"]`). flashdecode.peers loads them from there with stand-ins for
# the few package helpers they import (FLASHDECODE_PEER_SRC, default .whl/peers). Their code is not in this repo.
set -euo pipefail
SGLANG=${SGLANG:-0.5.10.post1}
VLLM=${VLLM:-0.33.0}
dest=${1:-.whl/peers}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip_dl() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$tmp" "$1"
}
pip_dl "sglang==$SGLANG"
pip_dl "vllm==$VLLM"
mkdir -p "$dest/sglang" "$dest/vllm"
unzip -o -q -j "$tmp"/sglang-*.whl 'sglang/srt/layers/attention/triton_ops/decode_attention.py' -d "$dest/sglang"
unzip -o -q -j "$tmp"/vllm-*.whl 'vllm/v1/attention/ops/triton_unified_attention.py' \
  'vllm/v1/attention/ops/triton_attention_helpers.py' -d "$dest/vllm"
printf 'sglang %s\nvllm %s\n' "$SGLANG" "$VLLM" > "$dest/VERSIONS"
ls -l "$dest"/*/
