"""The engine in a process of its own (engine/engine_core.py, engine/process_engine.py) behind the
real server, with the real SmolLM2: the same greedy text as the engine run directly (streamed
and not, two requests at once), exact usage and /metrics counters, a closed stream aborting its
request in the engine process, a clean stop, and a killed engine process reported dead."""

from __future__ import annotations

import io
import os
import signal
import time

import httpx
import openai
import pytest

from mtpserve.config import EngineConfig
from mtpserve.sampling_params import SamplingParams
from mtpserve.server.api import build_app, make_engine
from mtpserve.server.runner import BackgroundServer
from mtpserve.server.wait_ready import EXIT_DEAD, EXIT_READY, wait_ready

CONFIG = EngineConfig(max_model_len=256, num_kv_blocks=64, max_num_seqs=4)
MODEL = "smol"
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def _server():
    engine = make_engine(CONFIG, engine_process=True)
    srv = BackgroundServer(build_app(engine, served_model_name=MODEL))
    srv.engine = engine
    return srv


@pytest.fixture(scope="module")
def server():
    with _server() as srv:
        log = io.StringIO()
        assert wait_ready(srv.url, 300, interval_s=0.1, out=log) == EXIT_READY, log.getvalue()
        yield srv


@pytest.fixture(scope="module")
def reference(smollm2_llm):
    """Greedy completions of PROMPTS by the engine run directly."""
    tok = smollm2_llm.tokenizer
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    return [r.outputs[0] for r in smollm2_llm.generate(
        [tok(p)["input_ids"] for p in PROMPTS], params)]


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def test_the_server_side_reads_the_engine_process(server, smollm2_llm):
    from mtpserve.engine.process_engine import ProcessEngine

    eng = server.engine
    assert isinstance(eng, ProcessEngine) and eng._proc.pid != os.getpid()
    assert eng.engine.max_model_len == 256 and eng.engine.model_config.vocab_size == 49152
    text = "The capital of France is Paris."
    assert eng.engine.tokenizer(text)["input_ids"] == smollm2_llm.tokenizer(text)["input_ids"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_completions_equal_the_engine_run_directly(server, reference):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    before = _metric(server.url, "mtpserve:generation_tokens_total")
    got = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=12, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert [c.text for c in sorted(got.choices, key=lambda c: c.index)] == \
        [r.text for r in reference]
    assert got.usage.completion_tokens == 24
    assert _metric(server.url, "mtpserve:generation_tokens_total") - before == 24
    stream = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=12,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in stream) == reference[1].text


def test_a_closed_stream_aborts_its_request_in_the_engine_process(server, reference):
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 200, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break   # first chunk: close the stream with ~199 tokens to go
    deadline = time.monotonic() + 60
    while server.engine.stats()["num_running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    # the engine process dropped it live (not at its 200th token)
    assert server.engine.stats()["num_running"] == 0
    assert server.engine.stats()["num_aborted"] == 1
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    again = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert again.choices[0].text == reference[0].text


def _until(cond, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_killed_engine_process_is_reported_dead_and_a_stop_is_clean():
    with _server() as srv:
        assert wait_ready(srv.url, 300, interval_s=0.1, out=io.StringIO()) == EXIT_READY
        _until(lambda: "num_aborted" in srv.engine.stats())   # the engine's, sent with ready
        assert srv.engine.stats()["num_aborted"] == 0
        proc = srv.engine._proc
        body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 200, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: {"):
                    break   # running: kill the engine under it
            assert _metric(srv.url, "mtpserve:num_requests_running") == 1
            os.kill(proc.pid, signal.SIGKILL)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]" and "engine process exited" in rest[-2]
        _until(lambda: srv.engine.dead)
        # nothing runs in a dead engine: the gauges say so
        assert _metric(srv.url, "mtpserve:num_requests_running") == 0
        log = io.StringIO()
        assert wait_ready(srv.url, 30, interval_s=0.05, out=log) == EXIT_DEAD, log.getvalue()
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 503 and r.json() == {
            "status": "dead", "error": "the engine process exited (code -9)"}
        r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
    with _server() as srv:
        assert wait_ready(srv.url, 300, interval_s=0.1, out=io.StringIO()) == EXIT_READY
        proc = srv.engine._proc
    assert not proc.is_alive() and proc.exitcode == 0   # told to stop: exits on its own


def test_messages_to_the_engine_never_block_the_caller():
    """A full pipe (the engine busy in a long step) blocks its writer: the sender thread, not
    the event loop that submits requests."""
    import threading

    from mtpserve.engine.process_engine import ProcessEngine

    class FullPipe:
        def __init__(self):
            self.open, self.sent = threading.Event(), []

        def send(self, msg):
            self.open.wait()
            self.sent.append(msg)

    eng = ProcessEngine(CONFIG)
    eng._conn = pipe = FullPipe()
    eng._sender = threading.Thread(target=eng._write, daemon=True)
    eng._sender.start()
    for i in range(3):
        eng._send(("abort", f"r{i}"))   # returns while the first send is still blocked
    assert pipe.sent == []
    pipe.open.set()
    eng._outbox.put(None)
    eng._sender.join(10)
    assert pipe.sent == [("abort", "r0"), ("abort", "r1"), ("abort", "r2")]


def _first_output(act):
    """A ProcessEngine (no process) and a sink of request "r1" on a running event loop;
    ``act(engine, sink)`` does the rest. Returns the first output the sink gets (within 5 s)
    and the engine's sinks after."""
    import asyncio

    from mtpserve.engine.async_engine import _Sink
    from mtpserve.engine.process_engine import ProcessEngine

    async def run():
        eng = ProcessEngine(CONFIG)
        q: asyncio.Queue = asyncio.Queue()
        act(eng, _Sink(asyncio.get_running_loop(), q))
        return await asyncio.wait_for(q.get(), 5), eng._sinks

    return asyncio.run(run())


def test_a_request_submitted_after_the_engine_died_ends_with_its_error():
    """The window between generate()'s liveness check and the request's registration: once the
    reader has marked the engine dead (and failed the open requests), a new one is failed at
    once with the engine's error instead of waiting forever."""
    from mtpserve.engine.async_engine import _Add

    def submit(eng, sink):
        eng.dead, eng.error = True, "RuntimeError: boom"
        eng._submit(_Add("r1", [1, 2], SamplingParams(), sink))

    out, sinks = _first_output(submit)
    assert (out.request_id, out.finished, out.finish_reason, out.error) == \
        ("r1", True, "abort", "RuntimeError: boom")
    assert sinks == {}


def test_a_clean_stop_ends_the_streams_in_flight_with_abort():
    """On a stop without error (shutdown, the reader's exit) every open stream ends with
    ``finish_reason="abort"``; the engine's description (``self.engine`` once ready) holds no
    deltas to deliver first (a review caught _fail_all asking it for them)."""
    import types

    def stop(eng, sink):
        eng.engine = types.SimpleNamespace(tokenizer=None, config=None, model_config=None,
                                           max_model_len=256)   # as the "ready" message sets
        eng._sinks["r1"] = sink
        eng._fail_all("abort")

    out, sinks = _first_output(stop)
    assert (out.request_id, out.finished, out.finish_reason, out.error) == \
        ("r1", True, "abort", "abort")
    assert sinks == {}


def test_the_engine_process_loop_is_profiled_when_asked(monkeypatch, tmp_path):
    """MTPSERVE_ENGINE_PROFILE reaches the spawned engine process: after a stop, its loop's
    profile is in PATH.<child pid>.txt with the steps it ran (5: one prefill, then four decode
    steps for 5 tokens; the warm-up request runs before the loop)."""
    from mtpserve.engine.loop_profile import ENV

    monkeypatch.setenv(ENV, str(tmp_path / "core"))
    with _server() as srv:
        assert wait_ready(srv.url, 300, interval_s=0.1, out=io.StringIO()) == EXIT_READY
        pid = srv.engine._proc.pid
        r = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": PROMPTS[0], "max_tokens": 5, "ignore_eos": True})
        assert r.json()["usage"]["completion_tokens"] == 5
    assert not srv.engine._proc.is_alive()
    text = (tmp_path / f"core.{pid}.txt").read_text()
    assert text.startswith("engine steps: 5\n") and "engine.py" in text
    assert (tmp_path / f"core.{pid}.prof").stat().st_size > 0
