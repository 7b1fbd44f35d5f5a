"""Request schemas of the OpenAI-compatible API (pydantic, strict types).

Strict mode: a JSON string is not accepted where a number is expected, ``1.5`` is not an integer
and ``1`` is not a boolean; integers are accepted for float fields. Unknown fields are ignored
(OpenAI clients send many we do not use). Besides the OpenAI fields the requests accept vLLM's
sampling extensions (``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``,
``stop_token_ids``, ``skip_special_tokens``, ``include_stop_str_in_output``, ``return_token_ids``).
Every choice carries vLLM's ``stop_reason``: the stop string or token id that ended it.

The prompt of a completion request and the content of a chat message are typed ``Any`` here and
checked by the serving code, which gives clearer messages than a failed union.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

# Most completions per prompt (OpenAI's limit).
MAX_N = 128
# Most alternatives per token in logprobs (SamplingParams' limit).
MAX_TOP_LOGPROBS = 20


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    """``stream_options``: ``include_usage`` adds a final chunk with ``usage`` and no choices."""

    include_usage: bool | None = False


class ChatMessage(_Strict):
    """One chat message; ``content`` is a string, a list of text parts, or null (assistant)."""

    role: str
    content: Any = None
    name: str | None = None


class SamplingRequest(_Strict):
    """Fields shared by chat and text completions."""

    model: str | None = None
    n: int | None = 1   # null: 1 (as vLLM)
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # vLLM extension: each choice (and each stream chunk) also carries its new token ids, and
    # the response its prompt's (chat: top level; completions: each choice; streams: first)
    return_token_ids: bool | None = False

    @field_validator("n")
    @classmethod
    def _n_null_is_one(cls, v: int | None) -> int:
        return 1 if v is None else v


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions.

    ``max_completion_tokens`` wins over the older ``max_tokens`` when both are given; when neither
    is given (or both are null) the completion may run up to the model's context length.
    ``logprobs`` (bool) turns on per-token logprobs; ``top_logprobs`` (0..20) needs it.
    """

    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict] | None = None
    tool_choice: Any = None
    response_format: dict | None = None
    add_generation_prompt: bool = True


class CompletionRequest(SamplingRequest):
    """POST /v1/completions.

    ``prompt``: a string, a list of strings, a list of token ids, or a list of such lists.
    ``max_tokens`` defaults to 16 (OpenAI's default); an explicit null means up to the context.
    ``logprobs`` (0..20) returns the legacy logprobs object with that many alternatives.
    """

    prompt: Any = None
    max_tokens: int | None = 16
    echo: bool | None = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None
