"""Checks a request must pass before it enters the engine (shared by the server and ``LLM``)."""

from __future__ import annotations

from mtpserve.sampling_params import SamplingParams, SamplingParamsError


def validate_request(prompt_token_ids: list[int], params: SamplingParams, vocab_size: int,
                     max_model_len: int) -> None:
    """Raise ``SamplingParamsError`` (a ``ValueError`` with ``.param``) for a request that cannot
    be served: an empty prompt, token ids outside [0, vocab_size), a prompt that leaves no room to
    generate, or prompt + max_tokens beyond ``max_model_len``; plus every ``SamplingParams`` check.
    """
    params.validate(vocab_size)
    n = len(prompt_token_ids)
    if n == 0:
        raise SamplingParamsError("prompt", "the prompt is empty")
    bad = [t for t in prompt_token_ids
           if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size]
    if bad:
        raise SamplingParamsError("prompt", f"token id {bad[0]} is outside the vocabulary "
                                            f"[0, {vocab_size})")
    if n >= max_model_len:
        raise SamplingParamsError("prompt", f"the prompt has {n} tokens; this model's context "
                                            f"(max_model_len) is {max_model_len} tokens, which "
                                            f"leaves no room to generate")
    if params.max_tokens is not None and n + params.max_tokens > max_model_len:
        raise SamplingParamsError("max_tokens", f"max_tokens is {params.max_tokens} and the prompt "
                                                f"has {n} tokens: {n + params.max_tokens} is more "
                                                f"than max_model_len ({max_model_len})")
