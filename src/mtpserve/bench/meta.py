"""Where and when a benchmark ran: date, mtpserve version and git commit, host CPU / GPUs."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import subprocess

import mtpserve


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_commit() -> dict | None:
    """``{"commit", "dirty"}`` of the git checkout holding the mtpserve package; None outside
    one."""
    here = os.path.dirname(os.path.abspath(mtpserve.__file__))
    commit = _run(["git", "rev-parse", "HEAD"], cwd=here)
    if commit is None:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here)
    return {"commit": commit, "dirty": bool(status)}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_info() -> dict:
    """This machine: CPU model and count, GPU names (from ``nvidia-smi``, if present)."""
    gpus = None
    if shutil.which("nvidia-smi"):
        names = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
        gpus = names.splitlines() if names else None
    return {"hostname": platform.node(), "cpu": _cpu_name(), "cpu_count": os.cpu_count(),
            "gpus": gpus, "python": platform.python_version()}


def run_metadata() -> dict:
    """``{"date", "mtpserve_version", "git", "host"}`` (date: local time, ISO 8601)."""
    return {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "mtpserve_version": getattr(mtpserve, "__version__", None),
            "git": git_commit(), "host": host_info()}
