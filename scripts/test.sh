#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on CPU. GPU-only tests skip without CUDA.
# One pytest-xdist worker per core, each test file kept on one worker (its module fixtures, e.g.
# an engine over the real model, are built once; not --dist loadgroup: with pytest 9.2 it
# silently stops grouping, pytest-xdist issue #1386); extra arguments go to pytest (-n 0:
# serial).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
exec python -m pytest -q -n auto --dist loadfile "$@"
