"""Server helpers without an engine: error params, fan-out ids and seeds, response state (usage,
speculative extension), logprob clamping and the GPT-2 byte table, health URLs, model names."""

from __future__ import annotations

import json

import pytest

from mtpserve.outputs import RequestOutput, SpecStats
from mtpserve.sampling_params import SamplingParams
from mtpserve.server.errors import APIError, from_validation_errors, loc_to_param
from mtpserve.server.fanout import fan_out
from mtpserve.server.logprobs import _U2B, clamp
from mtpserve.server.model_context import default_model_name
from mtpserve.server.protocol import ChatCompletionRequest
from mtpserve.server.results import ResponseState
from mtpserve.server.sampling import fit_context
from mtpserve.server.wait_ready import health_url


def test_loc_to_param_uses_real_field_names():
    assert loc_to_param(("body", "messages", 2, "role")) == "messages[2].role"
    assert loc_to_param(("stop", "str"), ChatCompletionRequest) == "stop"
    assert loc_to_param(("messages", 0, "content"), ChatCompletionRequest) == "messages[0].content"
    assert loc_to_param(("stream_options", "include_usage"), ChatCompletionRequest) == \
        "stream_options.include_usage"
    assert loc_to_param(("prompt", "list[int]", 3)) == "prompt"
    assert loc_to_param(()) is None


def test_union_errors_merge_into_one_message():
    from pydantic import ValidationError
    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({"messages": [], "stop": 5})
    err = from_validation_errors(e.value.errors(), ChatCompletionRequest)
    assert err.status == 400 and err.param == "stop"
    assert err.message == "stop: expected a valid string or a valid list"


def test_fan_out_names_and_seeds_each_choice():
    p = SamplingParams(n=3, seed=7, stop=["x"], max_tokens=5)
    q = SamplingParams(n=3, seed=None, max_tokens=9)
    reqs = fan_out("r", [[1, 2], [3]], [p, q])
    assert [r.request_id for r in reqs] == [f"r-{i}" for i in range(6)]
    assert [r.index for r in reqs] == list(range(6))
    assert [r.params.seed for r in reqs] == [7, 8, 9, None, None, None]
    assert [r.params.n for r in reqs] == [1] * 6
    assert [r.params.max_tokens for r in reqs] == [5, 5, 5, 9, 9, 9]
    assert [r.prompt_token_ids for r in reqs] == [[1, 2]] * 3 + [[3]] * 3
    reqs[0].params.stop.append("y")
    assert p.stop == ["x"] and reqs[1].params.stop == ["x"]


def _out(rid, ids, text, finished=False, spec=None, cached=0, reason="length"):
    return RequestOutput(rid, ids, text, None, finished, reason if finished else None,
                         num_cached_tokens=cached, spec=spec)


def test_response_state_usage_counts_each_prompt_once():
    reqs = fan_out("r", [[1, 2, 3], [4, 5]], [SamplingParams(n=2)] * 2)
    st = ResponseState(reqs, n=2)
    st.add(0, _out("r-0", [9, 9], "ab", cached=0))
    st.add(1, _out("r-1", [9], "c", finished=True, cached=3))
    st.add(2, _out("r-2", [8, 8, 8], "def", finished=True, cached=1))
    st.add(3, _out("r-3", [], "", finished=True))
    st.add(0, _out("r-0", [7], "g", finished=True))
    assert [c.text for c in st.choices] == ["abg", "c", "def", ""]
    assert st.usage() == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                          "prompt_tokens_details": {"cached_tokens": 1}}
    assert st.extension() is None


def test_spec_extension_sums_choices():
    reqs = fan_out("r", [[1]], [SamplingParams(n=2)])
    st = ResponseState(reqs, n=2)
    st.add(0, _out("r-0", [1, 2, 3], "x", True, SpecStats(6, 4, 3)))
    st.add(1, _out("r-1", [1], "y", True, SpecStats(2, 0, 1)))
    assert st.extension() == {"spec": {"num_draft_tokens": 8, "num_accepted_tokens": 4,
                                       "num_verify_steps": 4, "acceptance_length": 2.0}}


def test_engine_errors_become_400_or_503():
    reqs = fan_out("r", [[1]], [SamplingParams()])
    bad = RequestOutput("r-0", [], "", None, True, "abort", error="duplicate request id")
    with pytest.raises(APIError) as e:
        ResponseState(reqs, 1).add(0, bad, engine_alive=True)
    assert e.value.status == 400 and "duplicate request id" in e.value.message
    with pytest.raises(APIError) as e:
        ResponseState(reqs, 1).add(0, bad, engine_alive=False)
    assert e.value.status == 503


def test_fit_context_limits():
    p = SamplingParams(max_tokens=None)
    fit_context(p, 10, 32, prompt_param="prompt", max_tokens_param="max_tokens")
    assert p.max_tokens == 22
    with pytest.raises(APIError) as e:
        fit_context(SamplingParams(max_tokens=23), 10, 32, prompt_param="prompt",
                    max_tokens_param="max_completion_tokens")
    assert e.value.param == "max_completion_tokens" and e.value.code == "context_length_exceeded"
    assert "32" in e.value.message and "33" in e.value.message
    with pytest.raises(APIError) as e:
        fit_context(SamplingParams(max_tokens=None), 32, 32, prompt_param="messages",
                    max_tokens_param="max_tokens")
    assert e.value.param == "messages"
    with pytest.raises(APIError) as e:
        fit_context(SamplingParams(max_tokens=None, min_tokens=30), 10, 32, prompt_param="prompt",
                    max_tokens_param="max_tokens")
    assert e.value.param == "min_tokens"


def test_logprob_clamp_keeps_json_valid():
    assert clamp(-1.5) == -1.5
    assert clamp(float("-inf")) == -9999.0
    assert clamp(float("nan")) == -9999.0
    json.dumps([clamp(float("-inf"))], allow_nan=False)


def test_gpt2_byte_table_is_a_bijection():
    assert sorted(_U2B.values()) == list(range(256))
    assert _U2B["Ġ"] == 0x20 and _U2B["Ċ"] == 0x0A and _U2B["A"] == 0x41
    assert _U2B["Ń"] == 0xAD  # the soft hyphen is the last of the 68 remapped bytes (U+0143)


def test_health_url_and_model_names():
    for u in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/", "http://h:1/health"):
        assert health_url(u) == "http://h:1/health"
    assert default_model_name("/m/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"
    assert default_model_name("/m/Qwen3-0.6B/") == "Qwen3-0.6B"
    assert default_model_name(None) == "SmolLM2-135M-Instruct.Q4_1"
