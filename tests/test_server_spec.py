"""The server over a speculative engine (forced-accept proposer, k = 3, real SmolLM2): deltas of
several tokens, exact usage, and the ``mtpserve.spec`` extension on the response / final chunk."""

from __future__ import annotations

import io
import json

import httpx
import pytest

from mtpserve.config import EngineConfig, SpeculativeConfig
from mtpserve.server.api import build_app, make_engine
from mtpserve.server.runner import BackgroundServer
from mtpserve.server.wait_ready import wait_ready

MODEL = "smol-spec"
K = 3


@pytest.fixture(scope="module")
def http():
    cfg = EngineConfig(max_model_len=128, speculative=SpeculativeConfig("forced_accept", num_steps=K))
    with BackgroundServer(build_app(make_engine(cfg), served_model_name=MODEL)) as srv:
        log = io.StringIO()
        assert wait_ready(srv.url, 300, interval_s=0.1, out=log) == 0, log.getvalue()
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            yield c


BODY = {"model": MODEL, "prompt": [28, 253, 2683, 359], "max_tokens": 9, "temperature": 0,
        "ignore_eos": True}


def sse_chunks(http, body: dict) -> list[dict]:
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_extension_on_the_response(http):
    r = http.post("/v1/completions", json=BODY).json()
    spec = r["mtpserve"]["spec"]
    assert r["usage"]["completion_tokens"] == 9
    assert spec["num_verify_steps"] >= 1
    assert spec["num_accepted_tokens"] == spec["num_draft_tokens"]  # forced accept
    assert spec["num_draft_tokens"] <= K * spec["num_verify_steps"]
    assert spec["acceptance_length"] == pytest.approx(
        (spec["num_accepted_tokens"] + spec["num_verify_steps"]) / spec["num_verify_steps"])


def test_stream_counts_multi_token_deltas_exactly(http):
    full = http.post("/v1/completions", json=BODY).json()
    chunks = sse_chunks(http, {**BODY, "stream": True, "logprobs": 0,
                               "stream_options": {"include_usage": True}})
    per_chunk = [len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks
                 if c["choices"] and c["choices"][0]["logprobs"]]
    assert sum(per_chunk) == 9 and max(per_chunk) > 1
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == \
        full["choices"][0]["text"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == full["usage"]
    assert chunks[-1]["mtpserve"] == full["mtpserve"]
    assert all("mtpserve" not in c for c in chunks[:-1])


def test_stream_without_usage_puts_the_extension_on_the_last_finish_chunk(http):
    full = http.post("/v1/completions", json={**BODY, "n": 2}).json()
    chunks = sse_chunks(http, {**BODY, "n": 2, "stream": True})
    finals = [c for c in chunks if c["choices"][0]["finish_reason"] is not None]
    assert sorted(c["choices"][0]["index"] for c in finals) == [0, 1]
    assert chunks[-1] is finals[-1] and chunks[-1]["mtpserve"] == full["mtpserve"]
    assert all("mtpserve" not in c for c in chunks[:-1])


def test_extension_sums_the_choices(http):
    one = http.post("/v1/completions", json=BODY).json()["mtpserve"]["spec"]
    two = http.post("/v1/completions", json={**BODY, "n": 2}).json()["mtpserve"]["spec"]
    for key in ("num_draft_tokens", "num_accepted_tokens", "num_verify_steps"):
        assert two[key] == 2 * one[key]
    assert two["acceptance_length"] == pytest.approx(one["acceptance_length"])


# ---- stops inside accepted blocks, over HTTP, against a server without speculation -------------

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def plain():
    cfg = EngineConfig(max_model_len=128)
    with BackgroundServer(build_app(make_engine(cfg), served_model_name=MODEL)) as srv:
        assert wait_ready(srv.url, 300, interval_s=0.1, out=io.StringIO()) == 0
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            yield c


def chat_result(client, body: dict, stream: bool) -> dict:
    """text, token ids, logprobs, finish/stop reason, usage and spec stats of one chat request."""
    body = {"model": MODEL, "messages": QUESTION, "temperature": 0, "logprobs": True,
            "top_logprobs": 1, "return_token_ids": True, **body}
    if not stream:
        r = client.post("/v1/chat/completions", json=body).json()
        c = r["choices"][0]
        return {"text": c["message"]["content"], "ids": c["token_ids"],
                "logprobs": [t["logprob"] for t in c["logprobs"]["content"]],
                "tokens": [t["token"] for t in c["logprobs"]["content"]],
                "finish": (c["finish_reason"], c["stop_reason"]), "usage": r["usage"],
                "spec": r.get("mtpserve", {}).get("spec")}
    body.update(stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines()
                  if line and line != "data: [DONE]"]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    finishes = [(c["finish_reason"], c["stop_reason"]) for c in choices if c["finish_reason"]]
    assert len(finishes) == 1
    lps = [t for c in choices if c["logprobs"] for t in c["logprobs"]["content"]]
    return {"text": "".join(c["delta"].get("content", "") for c in choices),
            "ids": [t for c in choices for t in c.get("token_ids", [])],
            "logprobs": [t["logprob"] for t in lps], "tokens": [t["token"] for t in lps],
            "finish": finishes[0], "usage": chunks[-1]["usage"],
            "spec": chunks[-1].get("mtpserve", {}).get("spec")}


@pytest.mark.parametrize("stream", [False, True])
def test_stops_inside_accepted_blocks_over_http(http, plain, stream):
    full = chat_result(plain, {"max_tokens": 20}, stream=False)
    assert full["text"] == "The capital of France is Paris." and full["finish"] == ("stop", None)
    paris = full["ids"][5]
    cases = {  # request extras -> index of the output token that ends the request
        "stop string": ({"stop": ["of Fr"]}, 3),
        "stop token": ({"stop_token_ids": [paris]}, 5),
        "eos": ({"max_tokens": 20}, 7),
        "max_tokens": ({"max_tokens": 6}, 5),
    }
    for name, (extra, end) in cases.items():
        # token 0 comes from the prefill, then blocks of k drafts + 1 bonus: not a block's end
        assert (end - 1) % (K + 1) != K, name
        ref = chat_result(plain, extra, stream)
        got = chat_result(http, extra, stream)
        assert len(ref["ids"]) == end + 1 and ref["usage"]["completion_tokens"] == end + 1, name
        for key in ("text", "ids", "tokens", "finish"):
            assert got[key] == ref[key], (name, key)
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):  # cache hits differ
            assert got["usage"][key] == ref["usage"][key], (name, key)
        assert max(abs(a - b) for a, b in zip(got["logprobs"], ref["logprobs"])) <= 1e-4, name
        assert got["spec"]["num_accepted_tokens"] == got["spec"]["num_draft_tokens"] > 0, name
        assert ref["spec"] is None
    assert chat_result(plain, {"stop": ["of Fr"]}, stream)["text"] == "The capital "


def spec_metrics(client) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        if fam.name.startswith("mtpserve:spec_decode_"):
            for s in fam.samples:
                key = s.name + (f"{{le={s.labels['le']}}}" if "le" in s.labels else "")
                out[key] = s.value
    return out


def test_spec_metrics_count_exactly(http, plain):
    before = spec_metrics(http)
    r = http.post("/v1/completions", json=BODY).json()["mtpserve"]["spec"]
    after = spec_metrics(http)
    p = "mtpserve:spec_decode_"
    assert after[p + "num_draft_tokens_total"] - before[p + "num_draft_tokens_total"] == \
        r["num_draft_tokens"]
    assert after[p + "num_accepted_tokens_total"] - before[p + "num_accepted_tokens_total"] == \
        r["num_accepted_tokens"]
    steps = after[p + "num_verify_steps_total"] - before[p + "num_verify_steps_total"]
    assert steps == r["num_verify_steps"]
    hist = p + "accepted_tokens_per_step"
    assert after[hist + "_count"] - before[hist + "_count"] == steps
    assert after[hist + "_sum"] - before[hist + "_sum"] == r["num_accepted_tokens"]
    # forced accept with k = 3 and 9 tokens: full blocks accept 3, the last one what room allows
    full = after[hist + "_bucket{le=3.0}"] - after[hist + "_bucket{le=2.0}"]
    assert full - (before[hist + "_bucket{le=3.0}"] - before[hist + "_bucket{le=2.0}"]) >= 1
    assert spec_metrics(plain) == {}  # no speculation, no spec metrics
