"""``mtpserve wait-ready``: poll a server's /health until it is ready, for scripts and CI."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

import httpx

EXIT_READY = 0
EXIT_TIMEOUT = 1
EXIT_DEAD = 2
EXIT_AUTH = 3


def health_url(url: str) -> str:
    """``http://h:p``, ``http://h:p/``, ``http://h:p/v1`` or ``.../health`` -> ``http://h:p/health``."""
    base = url.rstrip("/")
    for suffix in ("/health", "/v1"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base + "/health"


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has ended: no such process, or (Linux) a zombie that its parent
    has not reaped yet (a shell's background job that exited)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:                       # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def wait_ready(url: str, timeout_s: float, api_key: str | None = None,
               interval_s: float = 0.5, out: TextIO | None = None,
               pid: int | None = None) -> int:
    """Poll ``GET <server>/health`` until it answers 200, then (with ``api_key``) check the key
    on ``GET /v1/models``.

    Args:
        url: the server's base URL (``http://127.0.0.1:8000``; a trailing ``/v1`` is accepted).
        timeout_s: give up after this many seconds.
        api_key: when given, also verify that /v1/models accepts it.
        interval_s: seconds between polls.
        out: where messages go (default ``sys.stderr``).
        pid: the server's process: stop waiting once it has ended (``mtpserve serve`` ends
            when its engine fails to start), instead of polling a closed port until the timeout.

    Returns:
        0 ready; 1 timed out (the message names the last status or connection error); 2 the server
        reports that its engine died, or process ``pid`` ended; 3 the API key was refused.
    """
    out = out or sys.stderr
    target = health_url(url)
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    last = "no answer yet"
    with httpx.Client() as client:
        while True:
            left = deadline - time.monotonic()
            if pid is not None and process_gone(pid):
                print(f"wait-ready: the server process {pid} ended before {target} was ready "
                      f"({last})", file=out)
                return EXIT_DEAD
            if left <= 0:
                print(f"wait-ready: {target} not ready after {timeout_s:g} s ({last})", file=out)
                return EXIT_TIMEOUT
            try:
                r = client.get(target, timeout=max(0.05, min(5.0, left)))
                if r.status_code == 200:
                    break
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                if r.status_code == 503 and _status(r) == "dead":
                    print(f"wait-ready: the server's engine died: {r.text[:500]}", file=out)
                    return EXIT_DEAD
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            time.sleep(max(0.0, min(interval_s, deadline - time.monotonic())))
        if api_key is not None:
            code = _check_key(client, target[: -len("/health")], api_key, out)
            if code != EXIT_READY:
                return code
    print(f"wait-ready: {target} ready after {time.monotonic() - t0:.1f} s", file=out)
    return EXIT_READY


def _status(r: httpx.Response) -> str | None:
    try:
        return r.json().get("status")
    except ValueError:
        return None


def _check_key(client: httpx.Client, base: str, api_key: str, out: TextIO) -> int:
    try:
        r = client.get(base + "/v1/models", headers={"Authorization": f"Bearer {api_key}"},
                       timeout=10.0)
    except httpx.HTTPError as e:
        print(f"wait-ready: {base}/v1/models failed: {type(e).__name__}: {e}", file=out)
        return EXIT_TIMEOUT
    if r.status_code == 401:
        print(f"wait-ready: {base} refused the API key (401)", file=out)
        return EXIT_AUTH
    if r.status_code != 200:
        print(f"wait-ready: {base}/v1/models answered HTTP {r.status_code}: {r.text[:200]}",
              file=out)
        return EXIT_TIMEOUT
    return EXIT_READY
