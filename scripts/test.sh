#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on CPU. GPU-only tests skip without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
exec python -m pytest -q "$@"
