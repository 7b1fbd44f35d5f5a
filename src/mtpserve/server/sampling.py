"""From an API request to validated :class:`SamplingParams`, and the context-length checks."""

from __future__ import annotations

from mtpserve.sampling_params import SamplingParams, SamplingParamsError
from mtpserve.server.errors import bad_request, from_sampling_error
from mtpserve.server.protocol import MAX_N, SamplingRequest

CONTEXT_CODE = "context_length_exceeded"


def sampling_params(req: SamplingRequest, *, max_tokens: int | None, logprobs: int | None,
                    vocab_size: int, rename: dict[str, str]) -> SamplingParams:
    """Validated engine params for ``req`` (``max_tokens`` None: fixed later by :func:`fit_context`).

    ``rename`` maps SamplingParams field names to this endpoint's field names in errors.

    Raises:
        APIError: 400 naming the bad field.
    """
    if req.n > MAX_N:
        raise bad_request(f"n must be at most {MAX_N}, got {req.n}", param="n")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true (as OpenAI and "
                          "vLLM)", param="stream_options")
    if max_tokens is not None and max_tokens < 1:
        name = rename.get("max_tokens", "max_tokens")
        raise bad_request(f"{name} must be at least 1, got {max_tokens}", param=name)
    params = SamplingParams(
        n=req.n, max_tokens=max_tokens, min_tokens=req.min_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0 if req.top_k is None else req.top_k,
        min_p=0.0 if req.min_p is None else req.min_p,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=_logit_bias(req.logit_bias), seed=req.seed,
        stop=[req.stop] if isinstance(req.stop, str) else list(req.stop or []),
        stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos,
        include_stop_str_in_output=req.include_stop_str_in_output, logprobs=logprobs,
        skip_special_tokens=req.skip_special_tokens)
    try:
        params.validate(vocab_size)
    except SamplingParamsError as e:
        raise from_sampling_error(e, rename) from None
    return params


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if not bias:
        return None
    out = {}
    for k, v in bias.items():
        try:
            out[int(k)] = v
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids, got {k!r}",
                              param="logit_bias") from None
    return out


def check_token_ids(ids: list, vocab_size: int, param: str) -> list[int]:
    """``ids`` if every one is an int in ``[0, vocab_size)``.

    Raises:
        APIError: 400 naming the first bad id and its position.
    """
    for i, t in enumerate(ids):
        if type(t) is not int:
            raise bad_request(f"{param}[{i}] must be a token id (integer), got {t!r}", param=param)
        if not 0 <= t < vocab_size:
            raise bad_request(f"token id {t} at {param}[{i}] is outside the vocabulary "
                              f"[0, {vocab_size})", param=param)
    return ids


def fit_context(params: SamplingParams, prompt_len: int, max_model_len: int, *,
                prompt_param: str, max_tokens_param: str) -> None:
    """Check that the prompt and the completion fit; set ``max_tokens`` when it is None.

    A prompt needs room for at least one generated token (``prompt_len < max_model_len``);
    ``prompt_len + max_tokens`` may not exceed ``max_model_len``.

    Raises:
        APIError: 400 with code ``context_length_exceeded`` naming both numbers.
    """
    if prompt_len == 0:
        raise bad_request("the prompt is empty (0 tokens)", param=prompt_param)
    if prompt_len >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_len} tokens (at least one token must be left for the completion).",
            param=prompt_param, code=CONTEXT_CODE)
    if params.max_tokens is None:
        params.max_tokens = max_model_len - prompt_len
        if params.min_tokens > params.max_tokens:
            raise bad_request(f"min_tokens ({params.min_tokens}) is more than the {params.max_tokens}"
                              f" tokens left in the context", param="min_tokens",
                              code=CONTEXT_CODE)
        return
    if prompt_len + params.max_tokens > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_len + params.max_tokens} tokens ({prompt_len} in the prompt, "
            f"{params.max_tokens} for the completion). Reduce the prompt or {max_tokens_param}.",
            param=max_tokens_param, code=CONTEXT_CODE)
