# Sourced by the scripts/gpu_*.sh that need the peers: installs the carried wheels (.whl/, git-ignored) into
# /tmp/site, unpacks FlashInfer's prebuilt sm90a decode kernels there (so the benchmark skips its JIT build), prints
# the GPU, and builds .venv (make venv reuses the image's torch and triton).
export PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=/tmp/fiws TVM_FFI_CACHE_DIR=/tmp/tvm_ffi_cache
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
  for t in .whl/flashinfer-*-aot-*.tar.gz; do [ -f "$t" ] && tar -xzf "$t" -C /tmp/site; done
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
make venv 2>&1 | tail -2
