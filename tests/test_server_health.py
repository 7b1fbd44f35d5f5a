"""Readiness over an engine's life: 503 while the model loads (the factory waits on an Event),
200 once warmed up, 503 after the engine loop dies (an injected step failure); and wait-ready
against each state and against a closed port."""

from __future__ import annotations

import io
import json
import socket
import threading

import httpx
import pytest

from mtpserve.config import EngineConfig
from mtpserve.engine.async_engine import AsyncEngine
from mtpserve.server.api import build_app
from mtpserve.server.runner import BackgroundServer
from mtpserve.server.wait_ready import EXIT_DEAD, EXIT_READY, EXIT_TIMEOUT, wait_ready

MODEL = "smol"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


class FailingEngine:
    """A real ``LLMEngine`` whose ``step`` raises once ``fail`` is set."""

    def __init__(self, inner):
        self._inner = inner
        self.fail = threading.Event()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def step(self):
        if self.fail.is_set():
            raise RuntimeError("injected step failure")
        return self._inner.step()


@pytest.fixture(scope="module")
def life():
    from mtpserve.engine.engine import LLMEngine

    gate = threading.Event()
    built: list[FailingEngine] = []

    def factory():
        gate.wait()
        built.append(FailingEngine(LLMEngine(EngineConfig(max_model_len=128))))
        return built[0]

    engine = AsyncEngine(factory, warmup=True)
    with BackgroundServer(build_app(engine, served_model_name=MODEL)) as srv:
        srv.engine, srv.gate, srv.built = engine, gate, built
        yield srv
        gate.set()  # never leave the engine thread waiting


def assert_503(r: httpx.Response, code: str) -> dict:
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["type"] == "service_unavailable" and err["code"] == code
    return err


def test_503_while_loading(life):
    r = httpx.get(life.url + "/health")
    assert r.status_code == 503 and r.json() == {"status": "starting"}
    assert_503(httpx.get(life.url + "/v1/models"), "engine_starting")
    assert_503(httpx.post(life.url + "/v1/chat/completions", json=CHAT), "engine_starting")
    assert_503(httpx.post(life.url + "/v1/completions", json={"prompt": "x"}), "engine_starting")
    assert httpx.get(life.url + "/metrics").status_code == 200
    log = io.StringIO()
    # 2 s: time for the client's first answer on a loaded machine (0.3 s once left none)
    assert wait_ready(life.url, 2, interval_s=0.05, out=log) == EXIT_TIMEOUT
    assert "not ready after 2 s" in log.getvalue() and "HTTP 503" in log.getvalue()


def test_200_after_warmup(life):
    life.gate.set()
    log = io.StringIO()
    assert wait_ready(life.url, 300, interval_s=0.05, out=log) == EXIT_READY, log.getvalue()
    assert "ready after" in log.getvalue()
    r = httpx.get(life.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = httpx.post(life.url + "/v1/chat/completions", json=CHAT, timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


def test_503_after_the_engine_loop_dies(life):
    body = {**CHAT, "max_tokens": 64, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", life.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for line in lines:  # wait for the first generated text, then kill the loop
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                    "content"):
                break
        life.built[0].fail.set()
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    err = json.loads(rest[-2][6:])["error"]
    assert err["type"] == "service_unavailable" and "injected step failure" in err["message"]
    assert all(json.loads(x[6:])["choices"][0]["finish_reason"] is None for x in rest[:-2])

    r = httpx.get(life.url + "/health")
    assert r.status_code == 503
    assert r.json() == {"status": "dead", "error": "RuntimeError: injected step failure"}
    assert "injected step failure" in assert_503(
        httpx.post(life.url + "/v1/chat/completions", json=CHAT), "engine_dead")["message"]
    log = io.StringIO()
    assert wait_ready(life.url, 30, out=log) == EXIT_DEAD
    assert "engine died" in log.getvalue()


def test_wait_ready_times_out_on_a_closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = io.StringIO()
    assert wait_ready(f"http://127.0.0.1:{port}", 2, interval_s=0.1, out=log) == EXIT_TIMEOUT
    msg = log.getvalue()
    assert f"http://127.0.0.1:{port}/health not ready after 2 s" in msg
    assert "ConnectError" in msg


def test_serve_on_a_busy_port_fails_before_loading_anything(caplog, monkeypatch):
    """`mtpserve serve` on a port in use: exit code 3 and a clear log line, and the engine is
    never built (a large model would otherwise load for minutes first)."""
    from mtpserve.server import api

    built = []
    monkeypatch.setattr(api, "make_engine", lambda *a, **k: built.append(1))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with caplog.at_level("ERROR", logger="mtpserve.server.api"):
            assert api.run_server(EngineConfig(), host="127.0.0.1", port=port) == 3
    assert built == []
    assert f"cannot listen on 127.0.0.1:{port}" in caplog.text
    assert "in use" in caplog.text


def test_serve_ends_with_code_1_when_the_engine_fails_to_start(tmp_path):
    """`mtpserve serve` whose engine cannot be built (MTP asked of a model without MTP layers:
    the default SmolLM2) logs why and ends with exit code 1, as vLLM's server does, instead of
    answering 503 for ever; `wait-ready --pid` sees the process end (or /health say "dead" just
    before it) and exits 2 at once."""
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "mtpserve", "serve", "--port", str(port),
                                 "--speculative-algorithm", "nextn"], stdout=f, stderr=f)
    try:
        out = io.StringIO()
        t0 = time.monotonic()
        code = wait_ready(f"http://127.0.0.1:{port}", 240, out=out, pid=proc.pid)
        assert code == EXIT_DEAD, (out.getvalue(), log.read_text()[-2000:])
        # The server answers "dead" on /health for the moment between the engine's failure and
        # its exit; either sign ends the wait with code 2 (both seen in CI).
        said = out.getvalue()
        died = "the server's engine died" in said and "needs a model with MTP layers" in said
        assert f"the server process {proc.pid} ended before" in said or died, said
        assert time.monotonic() - t0 < 120
        assert proc.wait(30) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert ("the engine failed to start (ValueError: --speculative-algorithm nextn needs a "
            "model with MTP layers") in text
    assert "stopping the server" in text


def test_wait_ready_returns_at_once_for_a_process_already_gone():
    """A pid that has exited (a zombie child not reaped yet counts) ends the wait with code 2
    before any timeout, naming the process; a live one does not."""
    import subprocess
    import sys
    import time

    from mtpserve.server.wait_ready import process_gone

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while not process_gone(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_gone(child.pid)          # still unreaped: a zombie
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = io.StringIO()
    t0 = time.monotonic()
    assert wait_ready(f"http://127.0.0.1:{port}", 30, out=log, pid=child.pid) == EXIT_DEAD
    assert time.monotonic() - t0 < 5
    assert f"the server process {child.pid} ended before" in log.getvalue()
    child.wait()
    assert process_gone(child.pid)          # reaped: no such process
    import os
    assert not process_gone(os.getpid())
