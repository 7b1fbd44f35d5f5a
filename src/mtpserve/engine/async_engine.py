"""The engine loop in a background thread, driven from asyncio (the HTTP server's side).

The thread owns the :class:`~mtpserve.engine.engine.LLMEngine`: it builds it, warms it up, runs one
internal request, and then loops over ``step()``. Requests and aborts arrive through a thread-safe
queue; each step's deltas go back to per-request ``asyncio.Queue`` objects, all of a step's in one
``loop.call_soon_threadsafe`` (one wake-up of the event loop per step, not one per request). A
consumer that falls behind (many streams on one event loop) gets the deltas queued for it merged
into one (:func:`merge_outputs`), so it writes one chunk for them, as vLLM's output processor
does. PyTorch releases the GIL inside its kernels, so the event loop keeps answering HTTP while a
step runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from mtpserve.engine.loop_profile import profiled_loop
from mtpserve.outputs import RequestOutput
from mtpserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; no request can be served."""


@dataclass
class _Sink:
    """Where a request's deltas go: its asyncio queue, on the event loop that awaits it."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue

    def __call__(self, out: RequestOutput) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, out)


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    sink: _Sink


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for q, out in items:
        q.put_nowait(out)


def merge_outputs(outs: list[RequestOutput]) -> RequestOutput:
    """Consecutive deltas of one request as one: their tokens, text and logprobs in order, the
    last one's finish, counters (cumulative) and error.

    Raises:
        ValueError: on an empty list or deltas of different requests.
    """
    if not outs or any(o.request_id != outs[0].request_id for o in outs):
        raise ValueError("merge_outputs needs deltas of one request")
    if len(outs) == 1:
        return outs[0]
    last = outs[-1]
    lps = [o.new_logprobs for o in outs]
    return dataclasses.replace(
        last, new_token_ids=[t for o in outs for t in o.new_token_ids],
        new_text="".join(o.new_text for o in outs),
        new_logprobs=None if all(lp is None for lp in lps) else [x for lp in lps for x in lp or []])


@dataclass
class _Abort:
    request_id: str | None      # None: every request in flight (server shutdown)


class AsyncEngine:
    """Thread-backed async front of the engine.

    Args:
        engine_factory: builds the ``LLMEngine`` (called in the engine thread, so loading weights
            does not block the event loop).
        warmup: run one internal request before reporting ready (``True`` for servers).

    ``ready`` turns true once the engine is built, warmed up and one internal request has finished;
    ``dead`` once the loop has stopped on an error (``error`` then holds the traceback's last line).
    """

    def __init__(self, engine_factory: Callable[[], object], warmup: bool = True):
        self._factory = engine_factory
        self._warmup = warmup
        self._inbox: queue.Queue = queue.Queue()
        self._sinks: dict[str, _Sink] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.engine = None
        self.ready = False
        self.dead = False
        self.error: str | None = None
        self.startup_seconds: float | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread (returns at once; poll ``ready``)."""
        self._thread = threading.Thread(target=self._run, name="mtpserve-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop; requests still in flight end with ``finish_reason="abort"``. Once the
        loop has ended, the LLMEngine (weights, KV cache) is released: an app's routes keep this
        object alive after the server stops (FastAPI caches endpoint callables globally)."""
        self._stop.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self.engine = self._factory = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self.dead

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            self.engine = self._factory()
            if self._warmup:
                self.engine.warmup()
            self.startup_seconds = time.perf_counter() - t0
            self.ready = True
            logger.info("engine ready in %.1f s", self.startup_seconds)
            self._loop()
        except BaseException as e:  # noqa: BLE001 - the loop must report any failure
            self.error = f"{type(e).__name__}: {e}"
            logger.error("engine loop died:\n%s", traceback.format_exc())
        finally:
            self.dead = not self._stop.is_set() or self.error is not None
            self.ready = False
            self._fail_all("abort" if self.error is None else "error")

    def _loop(self) -> None:
        eng = self.engine
        with profiled_loop() as count:   # (MTPSERVE_ENGINE_PROFILE: engine/loop_profile.py)
            while not self._stop.is_set():
                block = not eng.has_unfinished_requests()
                self._drain_inbox(block=block)
                if self._stop.is_set():
                    break
                if not eng.has_unfinished_requests():
                    continue
                self._deliver(eng.step())
                count.n += 1

    def _deliver(self, outs: list[RequestOutput]) -> None:
        """One step's deltas to their requests' queues: one ``call_soon_threadsafe`` per event
        loop for all of them."""
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        for out in outs:
            sink = self._sinks.get(out.request_id)
            if out.finished:
                self._sinks.pop(out.request_id, None)
            if sink is not None:
                batches.setdefault(sink.loop, []).append((sink.queue, out))
        for loop, items in batches.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _drain_inbox(self, block: bool) -> None:
        try:
            msg = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while msg is not None or not self._inbox.empty():
            if msg is not None:
                self._handle(msg)
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                break

    def _handle(self, msg: _Add | _Abort) -> None:
        eng = self.engine
        if isinstance(msg, _Add):
            self._sinks[msg.request_id] = msg.sink
            try:
                eng.add_request(msg.request_id, msg.prompt_token_ids, msg.params)
            except ValueError as e:  # validated earlier; keep the loop alive regardless
                self._sinks.pop(msg.request_id, None)
                msg.sink(RequestOutput.aborted(msg.request_id, str(e)))
        else:   # the engine lets go first, so a client that sees its stream end sees it gone
            # from the gauges too (ending the streams first raced a test reading num_running);
            # before that, the deltas a step left for the next call reach their clients (a
            # request that finished in that step ends as it finished, not as aborted)
            self._deliver(self._deferred_outputs())
            for rid in self._in_flight(msg.request_id):
                eng.abort_request(rid)
            self._end_sinks(msg.request_id)

    def _in_flight(self, request_id: str | None) -> list[str]:
        """``[request_id]``, or for None the ids of every request in flight."""
        return list(self._sinks) if request_id is None else [request_id]

    def _end_sinks(self, request_id: str | None) -> None:
        """End the streams of ``request_id`` (None: every request in flight) with
        ``finish_reason="abort"``, their sinks dropped."""
        for rid in self._in_flight(request_id):
            sink = self._sinks.pop(rid, None)
            if sink is not None:
                sink(RequestOutput.aborted(rid))

    def _deferred_outputs(self) -> list[RequestOutput]:
        """The deltas the engine holds for its next step (``LLMEngine.take_deferred_outputs``),
        taken now; none before the engine is built."""
        return self.engine.take_deferred_outputs() if self.engine is not None else []

    def _fail_all(self, reason: str) -> None:
        """End every stream in flight with ``finish_reason="abort"`` (``reason``, or the
        engine's error, as its message); on a stop, the deltas a step left for the next call
        reach their clients first."""
        outs = self._deferred_outputs() if self.error is None else []
        if outs:
            self._deliver(outs)
        for rid, sink in list(self._sinks.items()):
            sink(RequestOutput.aborted(rid, self.error or reason))
        self._sinks.clear()

    # ---- requests ----------------------------------------------------------------------------
    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Submit a request and yield its deltas until it finishes (deltas that queued up
        while the caller was busy come merged into one).

        Closing the iterator early (client disconnect) aborts the request in the engine.

        Raises:
            EngineDeadError: the engine loop is not running; or it died while this request ran
                (after any deltas already yielded).
        """
        if not self.alive or not self.ready:
            raise EngineDeadError(self.error or "engine is not running")
        q: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._submit(_Add(request_id, list(prompt_token_ids), params,
                          _Sink(asyncio.get_running_loop(), q)))
        finished = False
        try:
            while not finished:
                outs = [await q.get()]
                while not outs[-1].finished and not q.empty():   # behind: one delta for all
                    outs.append(q.get_nowait())
                out = merge_outputs(outs)
                finished = out.finished
                if out.error is not None and out.finish_reason == "abort" and self.dead:
                    raise EngineDeadError(out.error)
                yield out
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op when it already finished)."""
        self._submit(_Abort(request_id))

    def abort_all(self) -> None:
        """Abort every request in flight: their streams end with ``finish_reason="abort"``
        (what a server does on Ctrl-C / SIGTERM instead of finishing long generations)."""
        self._submit(_Abort(None))

    def _submit(self, msg: _Add | _Abort) -> None:
        """Hand a request or an abort to the engine loop (any thread)."""
        self._inbox.put(msg)

    def stats(self) -> dict[str, float]:
        """Engine gauges: ``num_running``, ``num_waiting``, ``kv_cache_usage`` (0..1)."""
        if self.engine is None:
            return {"num_running": 0, "num_waiting": 0, "kv_cache_usage": 0.0}
        return self.engine.stats()
