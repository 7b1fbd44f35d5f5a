"""OpenAI-compatible server over the real engine (SmolLM2-135M GGUF), driven by the `openai` client
on a live uvicorn server: results against the engine run directly, streaming vs non-streaming,
concurrency, usage, logprobs, metrics, API key, disconnects, and every bad input."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import time
import uuid

import httpx
import openai
import pytest

from mtpserve.config import EngineConfig
from mtpserve.outputs import CompletionOutput
from mtpserve.sampling_params import SamplingParams
from mtpserve.server.api import build_app, make_engine
from mtpserve.server.logprobs import TokenStrings
from mtpserve.server.runner import BackgroundServer
from mtpserve.server.wait_ready import wait_ready

MAX_MODEL_LEN = 256
MODEL = "smol"
KEY = "test-key"
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server():
    engine = make_engine(EngineConfig(max_model_len=MAX_MODEL_LEN))
    app = build_app(engine, served_model_name=MODEL, api_key=KEY)
    with BackgroundServer(app) as srv:
        log = io.StringIO()
        assert wait_ready(srv.url, 300, api_key=KEY, interval_s=0.1, out=log) == 0, log.getvalue()
        srv.engine = engine
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def tok(server):
    return server.engine.engine.tokenizer


def run_engine(server, ids: list[int], params: SamplingParams) -> CompletionOutput:
    """The reference: the same request sent straight to the AsyncEngine (no HTTP layer)."""
    async def go() -> CompletionOutput:
        c = CompletionOutput(0)
        async for out in server.engine.generate(f"ref-{uuid.uuid4().hex}", ids, params):
            c.add(out)
        return c
    return asyncio.run(go())


def chat_ids(tok, messages) -> list[int]:
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


# ---- models, results against the engine -------------------------------------------------------
def test_models_list_the_served_name(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["max_model_len"] == MAX_MODEL_LEN
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_chat_equals_engine_with_logprobs(server, client, tok):
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=3)
    ids = chat_ids(tok, HELLO)
    ref = run_engine(server, ids, SamplingParams(max_tokens=6, temperature=0, logprobs=3))
    ch = r.choices[0]
    assert ch.message.role == "assistant"
    assert ch.message.content == ref.text
    assert ch.finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == len(ref.token_ids) == len(ch.logprobs.content)
    assert r.usage.total_tokens == len(ids) + len(ref.token_ids)
    strings = TokenStrings(tok)
    for got, want in zip(ch.logprobs.content, ref.logprobs, strict=True):
        assert bytes(got.bytes) == strings.bytes(want.token_id)
        assert got.token == strings.text(want.token_id)
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)  # prefix-cache numerics
        assert [t.logprob for t in got.top_logprobs] == pytest.approx([lp for _, lp in want.top], abs=1e-4)
        assert [bytes(t.bytes) for t in got.top_logprobs] == [strings.bytes(t) for t, _ in want.top]
    assert b"".join(bytes(t.bytes) for t in ch.logprobs.content).decode() == ref.text
    assert "mtpserve" not in (r.model_extra or {})  # no speculative stats without speculation


def test_completion_token_ids_equal_text_prompt(server, client, tok):
    text = "The capital of France is"
    ids = tok.encode(text)
    a = client.completions.create(model=MODEL, prompt=text, max_tokens=4, temperature=0)
    b = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0)
    ref = run_engine(server, ids, SamplingParams(max_tokens=4, temperature=0))
    assert a.choices[0].text == b.choices[0].text == ref.text
    assert a.usage.prompt_tokens == b.usage.prompt_tokens == len(ids)
    assert a.usage.completion_tokens == len(ref.token_ids)
    assert a.object == "text_completion"


def _sse(http, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return [json.loads(e[len("data: "):]) for e in r.iter_lines()
                if e and e != "data: [DONE]"]


def test_return_token_ids_gives_the_prompt_ids_as_vllm(http, tok):
    """vLLM's ``return_token_ids``: besides each choice's ``token_ids``, the prompt's ids: at
    the top of a chat response (in the first chunk of each choice when streaming), in each
    choice of a completion (in its first chunk when streaming); absent unless asked."""
    ids = chat_ids(tok, HELLO)
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 3, "temperature": 0, "n": 2,
            "return_token_ids": True}
    r = http.post("/v1/chat/completions", json=body).json()
    assert r["prompt_token_ids"] == ids and all(len(c["token_ids"]) == 3 for c in r["choices"])
    chunks = _sse(http, "/v1/chat/completions", body)
    assert [c["prompt_token_ids"] for c in chunks[:2]] == [ids, ids]
    assert [c["choices"][0]["index"] for c in chunks[:2]] == [0, 1]
    assert all("prompt_token_ids" not in c for c in chunks[2:])
    assert [t for c in chunks for ch in c["choices"] if ch["index"] == 0
            for t in ch.get("token_ids", [])] == r["choices"][0]["token_ids"]
    prompts = [tok.encode("Once upon a time"), tok.encode("1, 2, 3,")]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 3, "temperature": 0, "n": 2,
            "return_token_ids": True}
    r = http.post("/v1/completions", json=body).json()
    assert [c["prompt_token_ids"] for c in r["choices"]] == [prompts[0]] * 2 + [prompts[1]] * 2
    firsts = {}
    for c in _sse(http, "/v1/completions", body):
        for ch in c["choices"]:
            if ch["index"] not in firsts:
                firsts[ch["index"]] = ch.get("prompt_token_ids")
            else:
                assert "prompt_token_ids" not in ch
    assert firsts == {0: prompts[0], 1: prompts[0], 2: prompts[1], 3: prompts[1]}
    plain = http.post("/v1/completions", json={**body, "return_token_ids": False}).json()
    assert all("prompt_token_ids" not in c and "token_ids" not in c for c in plain["choices"])
    plain = http.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO,
                                                    "max_tokens": 2}).json()
    assert "prompt_token_ids" not in plain


def test_completion_defaults_to_16_tokens(client):
    r = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16
    assert r.choices[0].finish_reason == "length"


def test_legacy_logprobs(server, client, tok):
    ids = tok.encode("Once upon a time")
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0,
                                  logprobs=2)
    ref = run_engine(server, ids, SamplingParams(max_tokens=5, temperature=0, logprobs=2))
    lp = r.choices[0].logprobs
    strings = TokenStrings(tok)
    assert lp.tokens == [strings.text(t.token_id) for t in ref.logprobs]
    assert lp.token_logprobs == pytest.approx([t.logprob for t in ref.logprobs], abs=1e-4)
    assert lp.top_logprobs == [{strings.text(i): pytest.approx(v, abs=1e-4) for i, v in t.top}
                               for t in ref.logprobs]
    offsets = [sum(len(s) for s in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert lp.text_offset == offsets
    assert "".join(lp.tokens) == r.choices[0].text == ref.text


def test_echo_prepends_the_prompt(client):
    plain = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4, temperature=0)
    echo = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4, temperature=0,
                                     echo=True)
    assert echo.choices[0].text == "Once upon" + plain.choices[0].text
    assert echo.usage.completion_tokens == plain.usage.completion_tokens == 4


def test_n_and_prompt_lists_fan_out_with_seeds(client):
    prompts = ["Tell me a story about a cat", "Name a colour:"]
    common = dict(model=MODEL, max_tokens=4, temperature=1.0, seed=11)
    r = client.completions.create(prompt=prompts, n=2, **common)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    prompt_tokens = completion_tokens = 0
    for p, prompt in enumerate(prompts):
        for i in range(2):  # completion i of a prompt is seeded with seed + i
            alone = client.completions.create(prompt=prompt, n=1,
                                              **{**common, "seed": common["seed"] + i})
            assert r.choices[p * 2 + i].text == alone.choices[0].text
            assert r.choices[p * 2 + i].finish_reason == alone.choices[0].finish_reason
            completion_tokens += alone.usage.completion_tokens
        prompt_tokens += alone.usage.prompt_tokens  # each prompt counted once
    assert r.choices[0].text != r.choices[1].text
    assert r.usage.prompt_tokens == prompt_tokens
    assert r.usage.completion_tokens == completion_tokens


def test_stop_string_and_max_completion_tokens(client):
    base = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8,
                                          temperature=0)
    text = base.choices[0].message.content
    words = text.split()
    assert len(words) >= 3, text
    stop = " " + words[2]
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0,
                                       stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[: text.index(stop)]
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_completion_tokens=3,
                                       max_tokens=9, temperature=0)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_null_max_tokens_runs_up_to_the_context(client, tok):
    prompt = [tok.encode(" a")[0]] * (MAX_MODEL_LEN - 4)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=None, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == MAX_MODEL_LEN - 4
    assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"


# ---- streaming ------------------------------------------------------------------------------
def _collect_stream(chunks):
    texts, reasons, usage, n_chunks = {}, {}, [], 0
    for ch in chunks:
        n_chunks += 1
        if ch.usage is not None:
            usage.append(ch.usage)
            assert ch.choices == []
        for c in ch.choices:
            assert c.index not in reasons, "a chunk after the choice's finish_reason"
            piece = c.delta.content if hasattr(c, "delta") else c.text
            texts[c.index] = texts.get(c.index, "") + (piece or "")
            if c.finish_reason is not None:
                reasons[c.index] = c.finish_reason
    return texts, reasons, usage


def test_chat_stream_joins_to_non_stream(client):
    kw = dict(model=MODEL, messages=HELLO, max_tokens=6, temperature=0, n=2)
    client.chat.completions.create(**kw)   # the prompt in the prefix cache for both alike
    full = client.chat.completions.create(**kw)
    texts, reasons, usage = _collect_stream(client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kw))
    assert texts == {c.index: c.message.content for c in full.choices}
    assert reasons == {c.index: c.finish_reason for c in full.choices}
    assert len(usage) == 1 and usage[0].model_dump() == full.usage.model_dump()


def test_completion_stream_joins_to_non_stream(client):
    kw = dict(model=MODEL, prompt=["Once upon a time", "1, 2, 3,"], max_tokens=5, temperature=0,
              echo=True)
    full = client.completions.create(**kw)
    texts, reasons, usage = _collect_stream(client.completions.create(stream=True, **kw))
    assert texts == {c.index: c.text for c in full.choices}
    assert reasons == {c.index: c.finish_reason for c in full.choices}
    assert usage == []  # no usage chunk unless asked


def test_stream_without_usage_sends_no_usage(http):
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 3, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert all("usage" not in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert sum(c["choices"][0]["finish_reason"] is not None for c in chunks) == 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_16_concurrent_streams_equal_each_run_alone(client, server):
    prompts = [[{"role": "user", "content": f"Write one sentence about the number {i}."}]
               for i in range(16)]
    alone = [client.chat.completions.create(model=MODEL, messages=m, max_tokens=4, temperature=0)
             for m in prompts]

    async def one(ac, m):
        stream = await ac.chat.completions.create(model=MODEL, messages=m, max_tokens=4,
                                                  temperature=0, stream=True,
                                                  stream_options={"include_usage": True})
        return _collect_stream([ch async for ch in stream])

    async def all_at_once():
        ac = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        try:
            return await asyncio.gather(*(one(ac, m) for m in prompts))
        finally:
            await ac.close()

    for (texts, reasons, usage), ref in zip(asyncio.run(all_at_once()), alone, strict=True):
        assert texts == {0: ref.choices[0].message.content}
        assert reasons == {0: ref.choices[0].finish_reason}
        assert usage[0].completion_tokens == ref.usage.completion_tokens
        assert usage[0].prompt_tokens == ref.usage.prompt_tokens


def test_client_disconnect_aborts_the_engine_request(server, http):
    before = _metric(http, 'mtpserve:request_success_total{finish_reason="abort"}')
    body = {"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 200, "stream": True,
            "ignore_eos": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        first = next(line for line in r.iter_lines() if line)
        assert first.startswith("data: {")
    _poll(lambda: not server.engine.engine.seqs)
    assert server.engine.engine.seqs == {}
    assert _metric(http, 'mtpserve:request_success_total{finish_reason="abort"}') == before + 1
    assert server.engine.alive


def test_non_stream_disconnect_aborts_the_engine_request(server, http):
    before = _metric(http, 'mtpserve:request_success_total{finish_reason="abort"}')
    body = json.dumps({"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 200,
                       "ignore_eos": True}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nAuthorization: Bearer " + KEY.encode() + b"\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        _poll(lambda: any(r.startswith("cmpl-") for r in server.engine.engine.seqs))
    _poll(lambda: not server.engine.engine.seqs)
    assert server.engine.engine.seqs == {}
    assert _metric(http, 'mtpserve:request_success_total{finish_reason="abort"}') == before + 1


def _poll(cond, limit_s: float = 60.0) -> None:
    """Wait until ``cond()`` holds (a bound against hangs, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_token_bytes_rebuild_the_utf8_text(server, tok):
    strings = TokenStrings(tok)
    text = "naïve café → 🙂 日本語\n\tend"
    ids = tok.encode(text, add_special_tokens=False)
    assert b"".join(strings.bytes(t) for t in ids) == text.encode()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert strings.bytes(im_end) == b"<|im_end|>"


# ---- metrics and auth ---------------------------------------------------------------------
def _metric(http, name: str) -> float:
    text = httpx.get(str(http.base_url) + "/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_metrics_count_exactly(http):
    names = ['mtpserve:request_success_total{finish_reason="length"}',
             "mtpserve:prompt_tokens_total", "mtpserve:generation_tokens_total",
             "mtpserve:time_to_first_token_seconds_count",
             "mtpserve:inter_token_latency_seconds_count"]
    before = {n: _metric(http, n) for n in names}
    body = {"model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 3, "n": 2, "temperature": 0,
            "ignore_eos": True, "stream": True, "logprobs": 0}
    with http.stream("POST", "/v1/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    # with logprobs on, every engine output that carries tokens makes one chunk
    outputs = {0: 0, 1: 0}
    tokens = 0
    for ch in chunks:
        for c in ch["choices"]:
            if c["logprobs"] and c["logprobs"]["tokens"]:
                outputs[c["index"]] += 1
                tokens += len(c["logprobs"]["tokens"])
    after = {n: _metric(http, n) for n in names}
    delta = {n: after[n] - before[n] for n in names}
    assert tokens == 6
    assert delta[names[0]] == 2
    assert delta["mtpserve:prompt_tokens_total"] == 8  # counted per engine request
    assert delta["mtpserve:generation_tokens_total"] == 6
    assert delta["mtpserve:time_to_first_token_seconds_count"] == 2
    assert delta["mtpserve:inter_token_latency_seconds_count"] == outputs[0] - 1 + outputs[1] - 1
    text = httpx.get(str(http.base_url) + "/metrics").text
    for gauge in ("mtpserve:num_requests_running", "mtpserve:num_requests_waiting",
                  "mtpserve:kv_cache_usage_perc"):
        assert f"\n{gauge} " in text


def test_api_key_required_on_v1_only(server):
    url = server.url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.get(url + "/v1/models", headers=headers)
        assert r.status_code == 401
        err = r.json()["error"]
        assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
        r = httpx.post(url + "/v1/chat/completions", headers=headers,
                       json={"model": MODEL, "messages": HELLO})
        assert r.status_code == 401
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/metrics").status_code == 200
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1)


def test_wait_ready_checks_the_key(server):
    log = io.StringIO()
    assert wait_ready(server.url + "/v1", 10, api_key=KEY, out=log) == 0
    assert "ready" in log.getvalue()
    log = io.StringIO()
    assert wait_ready(server.url, 10, api_key="wrong", out=log) == 3
    assert "refused the API key" in log.getvalue()


def test_abort_all_ends_every_request_in_flight(server):
    """What the first Ctrl-C of `mtpserve serve` does (server/runner.py AbortingServer): every
    running request ends at once with finish_reason "abort", long before its max_tokens."""
    params = SamplingParams(max_tokens=MAX_MODEL_LEN - 8, ignore_eos=True, temperature=0.0)

    async def go():
        gens = [server.engine.generate(f"abort-all-{i}", [1, 2, 3, 4], params) for i in range(3)]
        firsts = [await g.__anext__() for g in gens]    # each has produced its first token
        assert not any(o.finished for o in firsts), firsts
        server.engine.abort_all()
        lasts, counts = [], []
        for g in gens:
            n = 0
            async for out in g:
                last, n = out, n + 1
            lasts.append(last)
            counts.append(n)
        return lasts, counts

    lasts, counts = asyncio.run(go())
    assert [o.finish_reason for o in lasts] == ["abort"] * 3
    assert all(n < MAX_MODEL_LEN // 2 for n in counts)
    assert server.engine.stats()["num_running"] == 0
