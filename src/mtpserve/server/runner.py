"""Running an app under uvicorn in a background thread on a free port (tests, benchmarks).

The foreground server of ``mtpserve serve`` is :func:`mtpserve.server.api.run_server`."""

from __future__ import annotations

import logging
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

logger = logging.getLogger(__name__)


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one), for uvicorn's ``sockets=``.

    Raises:
        OSError: the address is in use, not local, or not permitted.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class BackgroundServer:
    """Serve ``app`` with uvicorn in a daemon thread on ``host`` and a free port.

    Use as a context manager; ``url`` is ``http://host:port``. The app's lifespan runs, so an app
    from :func:`mtpserve.server.api.build_app` starts (and at exit stops) its engine.

    Raises:
        RuntimeError: from ``__enter__`` when uvicorn did not start within ``start_timeout_s``.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", start_timeout_s: float = 60.0):
        self._sock = listen_socket(host, 0)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        cfg = uvicorn.Config(app, log_level="warning", lifespan="on")
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="mtpserve-http", daemon=True)
        self._start_timeout_s = start_timeout_s

    def __enter__(self) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while (not self._server.started and self._thread.is_alive()
               and time.monotonic() < deadline):
            time.sleep(0.02)
        if not self._server.started:
            self.stop()
            raise RuntimeError(f"uvicorn did not start on {self.url}")
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask uvicorn to exit (runs the app's shutdown) and wait for the thread."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()


class AbortingServer(uvicorn.Server):
    """uvicorn's server whose first Ctrl-C / SIGTERM also aborts every request in flight in
    ``engine`` (an AsyncEngine or ProcessEngine), so open streams end at once with
    ``finish_reason="abort"`` instead of running on to their max_tokens before the server can
    stop; and which stops by itself, ``exit_code`` 1, when the engine dies before it was ever
    ready (a flag the model cannot serve, weights that do not load, no memory for the KV cache:
    nothing a retry of the same command fixes, so the command ends, as vLLM's and SGLang's do).
    An engine that dies after it was ready leaves the server up, /health answering 503."""

    def __init__(self, config: uvicorn.Config, engine):
        super().__init__(config)
        self.engine = engine
        self.exit_code = 0

    def handle_exit(self, sig, frame) -> None:
        self.engine.abort_all()
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's tick (every 0.1 s), which also ends the server once the engine failed to
        start."""
        if self.engine.dead and self.engine.startup_seconds is None and not self.exit_code:
            logger.error("the engine failed to start (%s); stopping the server", self.engine.error)
            self.exit_code = 1
            self.should_exit = True
        return await super().on_tick(counter)
