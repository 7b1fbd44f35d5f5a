"""Run kernel checks under Triton's CPU interpreter, in a subprocess: TRITON_INTERPRET must be set
before a kernel is defined, so the test process itself cannot switch to it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))


def run_interpreted(code: str, timeout: int = 600) -> str:
    """Run ``code`` (``tests/`` importable) with ``TRITON_INTERPRET=1``; fail the test unless it
    exits 0; return what follows ``RESULT `` on the line it printed so. Skips without Triton."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = f"import sys\nsys.path.insert(0, {TESTS!r})\n{code}"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return line[len("RESULT "):]
