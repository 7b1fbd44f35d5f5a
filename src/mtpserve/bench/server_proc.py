"""A ``mtpserve serve`` subprocess for one benchmark run: started on a free port, awaited with
the wait-ready logic, stopped with SIGTERM (SIGKILL after a timeout). On Linux the server also
gets SIGTERM when the benchmark process dies without stopping it (SIGKILL, a crash): the
kernel's parent-death signal, ``prctl(PR_SET_PDEATHSIG)``."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from mtpserve.bench.errors import BenchError
from mtpserve.parent_death import die_with_parent
from mtpserve.server.wait_ready import EXIT_READY, EXIT_TIMEOUT, wait_ready

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A TCP port that was free a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve_command(flags: list[str], port: int) -> list[str]:
    """The argv of ``mtpserve serve FLAGS --host 127.0.0.1 --port PORT`` with this Python."""
    return [sys.executable, "-m", "mtpserve.cli", "serve", *flags, "--host", HOST,
            "--port", str(port)]


class ServerProcess:
    """Context manager: ``mtpserve serve`` with ``flags`` in a subprocess; ``url`` once entered.
    ``command``: ``port -> argv`` of another server to start instead (benchmarks/cpu_stream.py
    and cpu_ttft.py run themselves as the server), awaited and stopped the same way;
    ``stop_signal``: what stops it (SIGINT lets such a uvicorn server run its ``finally``
    blocks: uvicorn re-raises a caught SIGTERM, whose default action ends the process).

    Its stdout and stderr go to ``log_path`` (default: a temporary file, removed after a clean
    run, kept when the server failed).

    Raises:
        BenchError: from ``__enter__`` when the server exits before it is ready, its engine dies,
            it refuses ``api_key``, or it is not ready within ``ready_timeout_s``; the message
            quotes the end of its log.
    """

    def __init__(self, flags: list[str], *, ready_timeout_s: float = 600.0,
                 stop_timeout_s: float = 30.0, log_path: str | None = None,
                 api_key: str | None = None, command=None,
                 stop_signal: int = signal.SIGTERM):
        self.flags = list(flags)
        self.command = command or (lambda port: serve_command(self.flags, port))
        self.stop_signal = stop_signal
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.api_key = api_key
        self._temp_log = log_path is None
        self.log_path = log_path or tempfile.mkstemp(prefix="mtpserve-bench-", suffix=".log")[1]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "ServerProcess":
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(self.port), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                         preexec_fn=die_with_parent)
        try:
            self._wait()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.stop()
        if self._temp_log and exc_type is None:
            os.unlink(self.log_path)

    def _wait(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise BenchError(f"the server exited with code {rc} before it was ready"
                                 f"{self._log_tail()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"the server on {self.url} was not ready after "
                                 f"{self.ready_timeout_s:g} s{self._log_tail()}")
            out = io.StringIO()
            code = wait_ready(self.url, min(2.0, left), api_key=self.api_key, interval_s=0.5,
                              out=out)
            if code == EXIT_READY:
                return
            if code != EXIT_TIMEOUT:
                raise BenchError(out.getvalue().strip() + self._log_tail())

    def _log_tail(self, lines: int = 25) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
        except OSError:
            return ""
        return f"\n--- last lines of {self.log_path}:\n" + "\n".join(tail)

    def stop(self) -> int | None:
        """``stop_signal`` (SIGTERM), wait ``stop_timeout_s``, then SIGKILL; returns the exit
        code (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
