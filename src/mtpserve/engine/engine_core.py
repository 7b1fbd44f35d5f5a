"""The engine loop in a process of its own (as vLLM's EngineCore and SGLang's scheduler process).

In one process, the engine thread and the HTTP event loop share one GIL: at 64 concurrent
streams on the H200 the server's time per output token was 5.0-9.2 ms against 4.4 ms per engine
step in process (BENCHMARKS.md, session 13), the engine's Python waiting while the event loop
encoded chunks and the other way round. Here the engine runs in a spawned process with its own
interpreter; it talks to the server over one ``multiprocessing`` pipe.

Messages, server to engine: ``("add", request_id, prompt_token_ids, params)``,
``("abort", request_id or None)`` (None: every request), ``("stop",)``.
Engine to server: ``("ready", info, startup_seconds)`` once built and warmed up (``info``:
tokenizer, config, model config, max_model_len: what the server reads from an engine);
``("out", outputs, stats)`` after each step (its ``RequestOutput`` deltas and
``LLMEngine.stats()`` right after it, so a client that has its last token sees the counters
that include it); ``("dead", error)`` when the loop stops on an error.
"""

from __future__ import annotations

import logging
import signal
import time
import traceback

from mtpserve.outputs import RequestOutput

logger = logging.getLogger(__name__)


def engine_info(eng) -> dict:
    """What the server process reads from a built engine (picklable)."""
    return {"tokenizer": eng.tokenizer, "config": eng.config,
            "model_config": eng.model_config, "max_model_len": eng.max_model_len}


def run_engine_core(conn, config, warmup: bool, log_level: int) -> None:
    """Entry point of the engine process: build ``LLMEngine(config)`` (``warmup``: run the
    internal request first), report ready, then serve ``conn`` until told to stop, the server
    goes away (its end of the pipe closes) or the engine fails."""
    from mtpserve.parent_death import die_with_parent

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the server's to handle
    logging.basicConfig(level=log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from mtpserve.engine.engine import LLMEngine

        t0 = time.perf_counter()
        eng = LLMEngine(config)
        if warmup:
            eng.warmup()
        conn.send(("ready", engine_info(eng), time.perf_counter() - t0))
        conn.send(("out", [], eng.stats()))   # /metrics has the counters before any request
        _serve(conn, eng)
    except (EOFError, BrokenPipeError):
        pass   # the server is gone
    except BaseException as e:  # noqa: BLE001 - the server must hear of any failure
        logger.error("engine loop died:\n%s", traceback.format_exc())
        try:
            conn.send(("dead", f"{type(e).__name__}: {e}"))
        except (OSError, ValueError):
            pass


def _serve(conn, eng) -> None:
    """Requests in, one step's deltas out, until ``("stop",)``, which first sends the deltas a
    synchronous step left for the next call under async scheduling (the reader delivers them
    before it ends the streams still open). Messages that leave nothing to run (an abort of the
    last request) still send the counters after them. Profiled under
    ``MTPSERVE_ENGINE_PROFILE`` (engine/loop_profile.py)."""
    from mtpserve.engine.loop_profile import profiled_loop

    with profiled_loop() as count:
        while True:
            idle = not eng.has_unfinished_requests()
            if idle and not conn.poll(0.5):
                continue
            while conn.poll(0):
                msg = conn.recv()
                if msg[0] == "stop":   # a synchronous step's held deltas before the end
                    conn.send(("out", eng.take_deferred_outputs(), eng.stats()))
                    return
                _handle(eng, conn, msg)
            if eng.has_unfinished_requests():
                outs = eng.step()
                count.n += 1
                conn.send(("out", outs, eng.stats()))
            else:
                conn.send(("out", [], eng.stats()))


def _handle(eng, conn, msg: tuple) -> None:
    """An ``add`` or ``abort`` message. A request the engine refuses (validated in the server
    already) ends at once with its error, and the loop goes on."""
    if msg[0] == "add":
        _, rid, prompt, params = msg
        try:
            eng.add_request(rid, prompt, params)
        except ValueError as e:
            conn.send(("out", [RequestOutput.aborted(rid, str(e))], eng.stats()))
    elif msg[0] == "abort":
        rids = list(eng.seqs) if msg[1] is None else [msg[1]]
        for rid in rids:
            eng.abort_request(rid)
    else:
        raise ValueError(f"unknown engine message {msg[0]!r}")
