"""Bad input gets an OpenAI error object with the right status, never a 500, a hang or a dead
engine; the next good request still succeeds. Real engine (SmolLM2-135M GGUF), live server."""

from __future__ import annotations

import io

import httpx
import openai
import pytest

from mtpserve.config import EngineConfig
from mtpserve.server.api import build_app, make_engine
from mtpserve.server.runner import BackgroundServer
from mtpserve.server.wait_ready import wait_ready

MAX_MODEL_LEN = 128
VOCAB = 49152  # SmolLM2's vocabulary
MSG = [{"role": "user", "content": "Hi"}]
CHAT, CMPL = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def server():
    engine = make_engine(EngineConfig(max_model_len=MAX_MODEL_LEN))
    with BackgroundServer(build_app(engine)) as srv:
        log = io.StringIO()
        assert wait_ready(srv.url, 300, interval_s=0.1, out=log) == 0, log.getvalue()
        srv.engine = engine
        srv.model = httpx.get(srv.url + "/v1/models").json()["data"][0]["id"]
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def chat(**kw) -> dict:
    return {"messages": MSG, "max_tokens": 2, **kw}


def cmpl(**kw) -> dict:
    return {"prompt": "Hi", "max_tokens": 2, **kw}


# (path, JSON body, status, param, code)
CASES = [
    ("model", CHAT, chat(model="no-such-model"), 404, "model", "model_not_found"),
    ("model-cmpl", CMPL, cmpl(model="no-such-model"), 404, "model", "model_not_found"),
    ("max_tokens=0", CHAT, chat(max_tokens=0), 400, "max_tokens", None),
    ("seed 2^70", CHAT, chat(seed=2**70), 400, "seed", None),
    ("max_tokens<0", CHAT, chat(max_tokens=-3), 400, "max_tokens", None),
    ("max_completion_tokens=0", CHAT, chat(max_completion_tokens=0), 400,
     "max_completion_tokens", None),
    ("cmpl max_tokens=0", CMPL, cmpl(max_tokens=0), 400, "max_tokens", None),
    ("max_tokens str", CHAT, chat(max_tokens="5"), 400, "max_tokens", None),
    ("max_tokens float", CHAT, chat(max_tokens=2.5), 400, "max_tokens", None),
    ("max_tokens too big", CHAT, chat(max_tokens=MAX_MODEL_LEN), 400, "max_tokens",
     "context_length_exceeded"),
    ("cmpl max_tokens too big", CMPL, cmpl(prompt=[1] * 10, max_tokens=MAX_MODEL_LEN - 9), 400,
     "max_tokens", "context_length_exceeded"),
    ("prompt too long", CMPL, cmpl(prompt=[1] * MAX_MODEL_LEN, max_tokens=None), 400, "prompt",
     "context_length_exceeded"),
    ("chat too long", CHAT, chat(messages=[{"role": "user", "content": "hi " * 200}],
                                 max_tokens=None), 400, "messages", "context_length_exceeded"),
    ("messages empty", CHAT, chat(messages=[]), 400, "messages", None),
    ("messages missing", CHAT, {"max_tokens": 2}, 400, "messages", None),
    ("messages not list", CHAT, chat(messages="Hi"), 400, "messages", None),
    ("unknown role", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400,
     "messages[0].role", None),
    ("role missing", CHAT, chat(messages=[MSG[0], {"content": "x"}]), 400, "messages[1].role",
     None),
    ("content number", CHAT, chat(messages=[{"role": "user", "content": 7}]), 400,
     "messages[0].content", None),
    ("image part", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]), 400, "messages[0].content[0]", None),
    ("user content null", CHAT, chat(messages=[{"role": "user", "content": None}]), 400,
     "messages[0].content", None),
    ("n=0", CHAT, chat(n=0), 400, "n", None),
    ("n<0", CMPL, cmpl(n=-1), 400, "n", None),
    ("n huge", CMPL, cmpl(n=1000), 400, "n", None),
    ("temperature<0", CHAT, chat(temperature=-0.1), 400, "temperature", None),
    ("temperature str", CHAT, chat(temperature="hot"), 400, "temperature", None),
    ("top_p=0", CHAT, chat(top_p=0), 400, "top_p", None),
    ("top_p>1", CMPL, cmpl(top_p=1.5), 400, "top_p", None),
    ("top_logprobs>20", CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs", None),
    ("top_logprobs w/o logprobs", CHAT, chat(top_logprobs=2), 400, "top_logprobs", None),
    ("cmpl logprobs>20", CMPL, cmpl(logprobs=21), 400, "logprobs", None),
    ("stop empty", CHAT, chat(stop=[""]), 400, "stop", None),
    ("stop number", CHAT, chat(stop=5), 400, "stop", None),
    ("stream str", CHAT, chat(stream="yes"), 400, "stream", None),
    ("token id < 0", CMPL, cmpl(prompt=[1, -5, 3]), 400, "prompt", None),
    ("token id = vocab", CMPL, cmpl(prompt=[1, VOCAB]), 400, "prompt", None),
    ("nested id out of vocab", CMPL, cmpl(prompt=[[1, 2], [VOCAB + 7]]), 400, "prompt[1]", None),
    ("token id float", CMPL, cmpl(prompt=[1, 2.0]), 400, "prompt", None),
    ("token id bool", CMPL, cmpl(prompt=[True, 2]), 400, "prompt", None),
    ("prompt empty str", CMPL, cmpl(prompt=""), 400, "prompt", None),
    ("prompt empty list", CMPL, cmpl(prompt=[]), 400, "prompt", None),
    ("prompt empty ids", CMPL, cmpl(prompt=[[1, 2], []]), 400, "prompt[1]", None),
    ("prompt mixed", CMPL, cmpl(prompt=["a", 1]), 400, "prompt", None),
    ("prompt dict", CMPL, cmpl(prompt={"text": "a"}), 400, "prompt", None),
    ("prompt missing", CMPL, {"max_tokens": 2}, 400, "prompt", None),
    ("stop_token_ids out of vocab", CMPL, cmpl(stop_token_ids=[VOCAB]), 400, "stop_token_ids",
     None),
    ("logit_bias key", CMPL, cmpl(logit_bias={"abc": 1}), 400, "logit_bias", None),
    ("logit_bias id", CMPL, cmpl(logit_bias={str(VOCAB): 1}), 400, "logit_bias", None),
    ("echo+logprobs", CMPL, cmpl(echo=True, logprobs=1), 400, "echo", None),
    ("suffix", CMPL, cmpl(suffix="x"), 400, "suffix", None),
    ("tools", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools",
     None),
    ("response_format", CHAT, chat(response_format={"type": "json_object"}), 400,
     "response_format", None),
    ("stream_options type", CHAT, chat(stream=True, stream_options={"include_usage": "y"}), 400,
     "stream_options.include_usage", None),
    ("stream_options w/o stream", CHAT, chat(stream_options={"include_usage": True}), 400,
     "stream_options", None),
    ("cmpl stream_options w/o stream", CMPL, cmpl(stream=False,
                                                  stream_options={"include_usage": True}), 400,
     "stream_options", None),
]


def good_request(http, model: str) -> None:
    r = http.post(CMPL, json={"model": model, "prompt": [1, 2, 3], "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 1


def assert_error(r: httpx.Response, status: int, param: str | None, code: str | None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param and err["code"] == code
    assert isinstance(err["message"], str) and err["message"]
    return err


@pytest.mark.parametrize("name,path,body,status,param,code", CASES, ids=[c[0] for c in CASES])
def test_bad_input_then_good_request(server, http, name, path, body, status, param, code):
    if "model" not in body:
        body = {"model": server.model, **body}
    assert_error(http.post(path, json=body), status, param, code)
    good_request(http, server.model)
    assert server.engine.alive


def test_context_error_names_both_numbers(server, http):
    body = {"model": server.model, "prompt": [1] * 10, "max_tokens": 200}
    err = assert_error(http.post(CMPL, json=body), 400, "max_tokens", "context_length_exceeded")
    assert str(MAX_MODEL_LEN) in err["message"] and "210" in err["message"]


@pytest.mark.parametrize("raw", [b'{"messages": [', b"\xff\xfe\x00{}", b"[1, 2]", b"",
                                 b'"just a string"', "{\"prompt\": \"caf\xe9\"}".encode("latin-1")])
def test_malformed_bodies(server, http, raw):
    for path in (CHAT, CMPL):
        r = http.post(path, content=raw, headers={"Content-Type": "application/json"})
        assert_error(r, 400, None, None)
    good_request(http, server.model)


@pytest.mark.parametrize("raw, says", [
    # Python refuses to convert an integer of more than 4300 digits (a ValueError, not a
    # JSONDecodeError); json's decoder recurses per nesting level (a RecursionError)
    (b'{"seed": 1' + b"0" * 5000 + b"}", "Exceeds the limit (4300 digits)"),
    (b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply")])
def test_bodies_python_cannot_decode_are_bad_requests(server, http, raw, says):
    for path in (CHAT, CMPL):
        r = http.post(path, content=raw, headers={"Content-Type": "application/json"})
        err = assert_error(r, 400, None, None)
        assert err["message"].startswith("the request body is not valid JSON: " + says)
    good_request(http, server.model)


def test_null_n_and_return_token_ids_mean_their_defaults(server, http):
    """As vLLM: ``"n": null`` is one choice, ``"return_token_ids": null`` returns no ids."""
    r = http.post(CMPL, json={"model": server.model, "prompt": [1, 2, 3], "max_tokens": 2,
                              "n": None, "return_token_ids": None})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 1 and "token_ids" not in choices[0]


@pytest.mark.parametrize("path,field,body", [
    (CHAT, "messages", '"messages": [{"role": "user", "content": "\\ud800 hi"}]'),
    (CHAT, "messages", '"messages": [{"role": "system", "content": "x\\ud83d"}, '
                       '{"role": "user", "content": "hi"}]'),
    (CMPL, "prompt", '"prompt": "\\ud800 hi"'),
    (CMPL, "prompt", '"prompt": ["ok", "\\udfff"]'),
])
def test_lone_surrogate_is_a_bad_request(server, http, path, field, body):
    """Valid JSON, invalid Unicode: a 400 naming the field, not a 500 from the tokenizer."""
    raw = f'{{"model": "{server.model}", "max_tokens": 2, {body}}}'.encode()
    err = assert_error(http.post(path, content=raw, headers={"Content-Type": "application/json"}),
                       400, field, None)
    assert "surrogate" in err["message"]
    good_request(http, server.model)


def test_unknown_route_and_method(http):
    r = http.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = http.get(CHAT)
    assert r.status_code == 405 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_openai_client_errors(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4", messages=MSG, max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=server.model, prompt="Hi", temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:  # also when streaming: before the stream
        c.chat.completions.create(model=server.model, messages=[], stream=True)
    assert e.value.body["param"] == "messages"
    r = c.chat.completions.create(model=server.model, messages=MSG, max_tokens=2,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 2


def test_null_max_tokens_fills_the_context(server, http):
    body = {"model": server.model, "prompt": [1] * (MAX_MODEL_LEN - 3), "max_tokens": None,
            "ignore_eos": True}
    r = http.post(CMPL, json=body)
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 3
