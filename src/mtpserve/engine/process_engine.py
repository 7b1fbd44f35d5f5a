"""The server's front of an engine in its own process (engine/engine_core.py).

Same interface as :class:`~mtpserve.engine.async_engine.AsyncEngine` (the HTTP layer does not
know which it has): ``start``, ``shutdown``, ``generate``, ``abort``, ``abort_all``, ``stats``,
``ready`` / ``alive`` / ``dead`` / ``error``, and ``engine`` with the ``tokenizer``, ``config``,
``model_config`` and ``max_model_len`` the server reads. A reader thread turns the engine's
messages into deltas on the requests' asyncio queues, one ``call_soon_threadsafe`` per step
(as AsyncEngine does). Requests and aborts go out through a sender thread: a pipe whose buffer
is full (40 prompts of 3000 tokens while the engine is in a long step) blocks its writer until the
engine reads, and the writer must not be the event loop (every route stalled 10 s otherwise).
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import threading
import time
import types

from mtpserve.engine.async_engine import AsyncEngine, _Abort, _Add
from mtpserve.outputs import RequestOutput

logger = logging.getLogger(__name__)


class ProcessEngine(AsyncEngine):
    """An engine in a spawned process, driven from asyncio.

    Args:
        config: the ``EngineConfig`` the process builds its ``LLMEngine`` from (picklable).
        warmup: run one internal request before reporting ready (``True`` for servers).

    ``dead`` turns true when the engine reported an error or its process exited without being
    told to stop (``error`` then says which, with the exit code).
    """

    def __init__(self, config, warmup: bool = True):
        super().__init__(lambda: None, warmup)
        self._config = config
        self._conn = None
        self._proc = None
        self._reader: threading.Thread | None = None
        self._sender: threading.Thread | None = None
        self._outbox: queue.Queue = queue.Queue()
        self._sinks_lock = threading.Lock()
        self._stats: dict | None = None
        self._t0 = 0.0

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the engine process and the threads that read and write its pipe (returns at
        once; poll ``ready``)."""
        from mtpserve.engine.engine_core import run_engine_core

        self._t0 = time.perf_counter()
        ctx = multiprocessing.get_context("spawn")   # CUDA cannot be used in a forked child
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=run_engine_core, name="mtpserve-engine-core",
                                 args=(child, self._config, self._warmup,
                                       logging.getLogger().getEffectiveLevel()), daemon=True)
        self._proc.start()
        child.close()
        self._reader = threading.Thread(target=self._read, name="mtpserve-engine-reader",
                                        daemon=True)
        self._sender = threading.Thread(target=self._write, name="mtpserve-engine-sender",
                                        daemon=True)
        self._reader.start()
        self._sender.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Tell the engine to stop and wait for it (then SIGTERM, then SIGKILL); requests still
        in flight end with ``finish_reason="abort"``. An engine still loading reads no message:
        it gets SIGTERM at once."""
        self._stop.set()
        self._send(("stop",))
        self._outbox.put(None)   # the sender's end
        if self._proc is not None:
            self._proc.join(timeout if self.ready else 0.0)
            for signal_it in (self._proc.terminate, self._proc.kill):
                if not self._proc.is_alive():
                    break
                signal_it()
                self._proc.join(5.0)
        for t in (self._reader, self._sender):
            if t is not None:
                t.join(timeout)
        self._fail_all("abort")

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive() and not self.dead

    def stats(self) -> dict:
        """The engine's gauges and counters after its latest step."""
        if self._stats is None:
            return {"num_running": 0, "num_waiting": 0, "kv_cache_usage": 0.0}
        return self._stats

    # ---- the pipe --------------------------------------------------------------------------
    def _read(self) -> None:
        """Until the engine's end closes: ready, each step's deltas, or its death."""
        try:
            while True:
                msg = self._conn.recv()
                if msg[0] == "out":
                    self._stats = msg[2]
                    self._deliver(msg[1])
                elif msg[0] == "ready":
                    self.engine = types.SimpleNamespace(**msg[1])
                    self.startup_seconds = time.perf_counter() - self._t0
                    self.ready = True
                    logger.info("engine ready in %.1f s (own process, pid %d; %.1f s of it "
                                "building and warming up)", self.startup_seconds,
                                self._proc.pid, msg[2])
                elif msg[0] == "dead":
                    self.error = msg[1]
                    break
        except (EOFError, OSError):
            pass
        if self.error is None and not self._stop.is_set():
            self._proc.join(1.0)
            self.error = f"the engine process exited (code {self._proc.exitcode})"
            logger.error(self.error)
        self.dead = self.error is not None
        self.ready = False
        if self._stats is not None:   # nothing runs any more; the counters stay
            self._stats = {**self._stats, "num_running": 0, "num_waiting": 0,
                           "kv_cache_usage": 0.0}
        self._fail_all("abort" if self.error is None else "error")

    def _submit(self, msg: _Add | _Abort) -> None:
        """A request or an abort to the engine process. A request that arrives once the reader
        has found the engine dead (``dead`` is set before it fails the open requests) ends at
        once with the engine's error instead of waiting for deltas that will never come."""
        if isinstance(msg, _Add):
            with self._sinks_lock:
                gone = self.dead or self._stop.is_set()
                if not gone:
                    self._sinks[msg.request_id] = msg.sink
            if gone:
                msg.sink(RequestOutput.aborted(msg.request_id,
                                               self.error or "the engine has stopped"))
                return
            self._send(("add", msg.request_id, msg.prompt_token_ids, msg.params))
            return
        self._end_sinks(msg.request_id)
        self._send(("abort", msg.request_id))

    def _send(self, msg: tuple) -> None:
        """One message to the engine, queued for the sender thread (never blocks)."""
        if self._conn is not None:
            self._outbox.put(msg)

    def _write(self) -> None:
        """The sender thread: the queued messages into the pipe, until told to end; nothing
        once the engine is gone (its death is the reader's to report)."""
        while (msg := self._outbox.get()) is not None:
            try:
                self._conn.send(msg)
            except (OSError, ValueError):
                pass

    def _deliver(self, outs: list[RequestOutput]) -> None:
        with self._sinks_lock:
            super()._deliver(outs)

    def _end_sinks(self, request_id: str | None) -> None:
        with self._sinks_lock:
            super()._end_sinks(request_id)

    def _deferred_outputs(self) -> list[RequestOutput]:
        """None here (``self.engine`` is only the engine's description): the engine process
        holds them. It drops an aborted request's, as this side ends that stream when it sends
        the abort, and sends the rest on a stop, before its pipe closes and the reader ends
        the streams still open (engine_core.py ``_serve``)."""
        return []

    def _fail_all(self, reason: str) -> None:
        with self._sinks_lock:
            super()._fail_all(reason)
