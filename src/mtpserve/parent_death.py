"""Children that do not outlive their parent: Linux's parent-death signal."""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1   # linux/prctl.h


def die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when the thread that started it exits (call it in
    the child: between fork and exec as ``Popen(preexec_fn=...)``, or first thing in a spawned
    process). Elsewhere, or without libc, nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass
