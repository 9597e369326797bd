#!/usr/bin/env bash
# Create .venv with flashdecode installed (editable) and its test + bench extras.
# - Where python3 already has torch and triton (a GPU image), the venv reuses them (--system-site-packages) and
#   installs nothing from a registry, so it works offline.
# - Elsewhere it installs the pinned CPU stack from constraints.txt (torch 2.13.0 CPU, triton 3.6.0, numpy<2.4).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import flashdecode, torch, triton, pytest, transformers" 2>/dev/null; then
  exit 0
fi
if "$PY" -c "import torch, triton" 2>/dev/null; then
  echo "bootstrap: using the torch/triton already installed for $PY ($("$PY" -c 'import torch, triton; print(torch.__version__, triton.__version__)'))"
  # python3 may itself be a venv (--system-site-packages would reach the base interpreter, not it): link its
  # site-packages and our src/ into the new venv with .pth files; nothing is downloaded or built
  "$PY" -m venv --without-pip "$VENV"
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  "$PY" -c "import site, sys; print('\n'.join(site.getsitepackages() + [p for p in sys.path if p.endswith('site-packages')]))" \
    | sort -u > "$site/_host_site_packages.pth"
  echo "$PWD/src" > "$site/flashdecode-src.pth"
else
  echo "bootstrap: installing the pinned CPU stack into $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[test,bench]"
fi
"$VENV/bin/python" -c "import flashdecode, torch, triton; print('bootstrap: ok, torch', torch.__version__, 'triton', triton.__version__)"
