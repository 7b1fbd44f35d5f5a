"""POST /v1/completions: prompt(s) -> engine -> text_completion (JSON or SSE chunks)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from mtpserve.engine.async_engine import AsyncEngine
from mtpserve.outputs import RequestOutput
from mtpserve.server.errors import bad_request
from mtpserve.server.fanout import fan_out
from mtpserve.server.logprobs import LegacyLogprobs, TokenStrings
from mtpserve.server.metrics import ServerMetrics
from mtpserve.server.model_context import ModelContext
from mtpserve.server.protocol import CompletionRequest
from mtpserve.server.sampling import check_token_ids, fit_context, sampling_params
from mtpserve.server.serving_common import (Run, check_model, encode_text, new_id, sse,
                                            with_token_ids)

_PROMPT_KINDS = ("prompt must be a string, a list of strings, a list of token ids, or a list of "
                 "lists of token ids")


def prompt_token_ids(prompt: Any, ctx: ModelContext) -> list[list[int]]:
    """The prompts of a completion request as token-id lists (strings are tokenized).

    Raises:
        APIError: 400 for a missing or empty prompt, a wrong type, or a token id outside
            ``[0, vocab_size)``.
    """
    if prompt is None:
        raise bad_request("prompt: field required", param="prompt")
    if isinstance(prompt, str):
        return [_encode(ctx, prompt)]
    if not isinstance(prompt, list) or not prompt:
        raise bad_request(_PROMPT_KINDS if prompt != [] else "prompt must not be empty",
                          param="prompt")
    first = prompt[0]
    if isinstance(first, str):
        if not all(isinstance(p, str) for p in prompt):
            raise bad_request(_PROMPT_KINDS, param="prompt")
        return [_encode(ctx, p) for p in prompt]
    if isinstance(first, int) and not isinstance(first, bool):
        return [check_token_ids(prompt, ctx.vocab_size, "prompt")]
    if isinstance(first, list):
        out = []
        for i, p in enumerate(prompt):
            if not isinstance(p, list):
                raise bad_request(_PROMPT_KINDS, param="prompt")
            out.append(check_token_ids(p, ctx.vocab_size, f"prompt[{i}]"))
        return out
    raise bad_request(_PROMPT_KINDS, param="prompt")


def _encode(ctx: ModelContext, text: str) -> list[int]:
    return encode_text(ctx.tokenizer, text, "prompt", add_special_tokens=True)


def _check_unsupported(req: CompletionRequest) -> None:
    if req.suffix is not None:
        raise bad_request("suffix is not supported by this server", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of is not supported (it must equal n)", param="best_of")
    if req.echo and req.logprobs is not None:
        raise bad_request("echo with logprobs needs prompt logprobs, which this server does "
                          "not compute", param="echo")


class CompletionServing:
    """Handler of /v1/completions over one engine."""

    def __init__(self, engine: AsyncEngine, metrics: ServerMetrics,
                 strings_for: Callable[[ModelContext], TokenStrings]):
        self.engine = engine
        self.metrics = metrics
        self._strings_for = strings_for

    async def create(self, req: CompletionRequest, ctx: ModelContext, request: Request):
        """Validate, run and answer one completion request (JSON, or SSE when ``stream``).

        An absent ``max_tokens`` is 16; an explicit null runs up to the context length.

        Raises:
            APIError: 400 / 404 for bad input, 503 when the engine is down.
        """
        arrival = time.perf_counter()
        check_model(req.model, ctx.name)
        _check_unsupported(req)
        params = sampling_params(req, max_tokens=req.max_tokens, logprobs=req.logprobs,
                                 vocab_size=ctx.vocab_size, rename={})
        prompts = prompt_token_ids(req.prompt, ctx)
        per_prompt = []
        for i, ids in enumerate(prompts):
            sp = dataclasses.replace(params, stop=list(params.stop))
            fit_context(sp, len(ids), ctx.max_model_len,
                        prompt_param="prompt" if len(prompts) == 1 else f"prompt[{i}]",
                        max_tokens_param="max_tokens")
            per_prompt.append(sp)
        rid = new_id("cmpl")
        run = Run(self.engine, self.metrics, fan_out(rid, prompts, per_prompt), params.n, arrival)
        echo = _echo_texts(req.prompt, prompts, ctx) if req.echo else None
        strings = self._strings_for(ctx) if req.logprobs is not None else None
        fmt = _CompletionFormat(run, rid, ctx.name, strings, echo,
                                bool(req.stream_options and req.stream_options.include_usage),
                                bool(req.return_token_ids))
        if req.stream:
            return StreamingResponse(run.stream(fmt.render, fmt.head(), fmt.tail),
                                     media_type="text/event-stream")
        await run.collect(request)
        return JSONResponse(fmt.response())


def _echo_texts(prompt: Any, prompts: list[list[int]], ctx: ModelContext) -> list[str]:
    """The text echoed before each prompt's completions: the prompt string itself, or the
    decoded token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt[0], str):
        return list(prompt)
    return [ctx.tokenizer.decode(ids, skip_special_tokens=False) for ids in prompts]


class _CompletionFormat:
    """Builds the text_completion object and its stream chunks for one run."""

    def __init__(self, run: Run, rid: str, model: str, strings: TokenStrings | None,
                 echo: list[str] | None, include_usage: bool, token_ids: bool = False):
        self.run, self.rid, self.model = run, rid, model
        self.token_ids = token_ids
        self.strings = strings
        self.include_usage = include_usage
        n = run.state.n
        self.prefix = {r.index: (echo[r.index // n] if echo else "") for r in run.reqs}
        self.lp = {r.index: LegacyLogprobs(strings, len(self.prefix[r.index]))
                   for r in run.reqs} if strings is not None else None
        self._open = len(run.reqs)
        self._prompt_ids = {r.index: r.prompt_token_ids for r in run.reqs}
        self._unsent = set(self._prompt_ids)   # choices whose prompt ids no chunk carried yet

    def _base(self) -> dict:
        return {"id": self.rid, "object": "text_completion", "created": self.run.created,
                "model": self.model}

    def _with_ids(self, choice: dict, token_ids: list[int]) -> dict:
        """vLLM's ``token_ids`` and, in a choice's first chunk (or its whole response),
        ``prompt_token_ids`` when token ids were asked for."""
        if not self.token_ids:
            return choice
        if choice["index"] in self._unsent:
            self._unsent.discard(choice["index"])
            choice["prompt_token_ids"] = list(self._prompt_ids[choice["index"]])
        return with_token_ids(choice, token_ids)

    def response(self) -> dict:
        st = self.run.state
        body = self._base()
        body["choices"] = [self._with_ids({
            "index": c.index, "text": self.prefix[c.index] + c.text,
            "logprobs": self.lp[c.index].build(c.logprobs or []) if self.lp else None,
            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}, c.token_ids)
            for c in st.choices]
        body["usage"] = st.usage()
        ext = st.extension()
        if ext is not None:
            body["mtpserve"] = ext
        return body

    def _chunk(self, choices: list[dict], last: bool = False, usage: dict | None = None) -> str:
        body = self._base()
        body["choices"] = choices
        if self.include_usage:
            body["usage"] = usage
        ext = self.run.state.extension() if last else None
        if ext is not None:
            body["mtpserve"] = ext
        return sse(body)

    def head(self) -> list[str]:
        return [self._chunk([self._with_ids({"index": i, "text": t, "logprobs": None,
                                             "finish_reason": None}, [])])
                for i, t in self.prefix.items() if t]

    def render(self, index: int, out: RequestOutput) -> list[str]:
        lp = (self.lp[index].build(out.new_logprobs)
              if self.lp is not None and out.new_logprobs else None)
        ids = out.new_token_ids if self.token_ids else None
        if not (out.new_text or out.finished or lp is not None or ids):
            return []
        self._open -= out.finished
        last = out.finished and self._open == 0 and not self.include_usage
        choice = {"index": index, "text": out.new_text, "logprobs": lp,
                  "finish_reason": out.finish_reason if out.finished else None,
                  "stop_reason": out.stop_reason if out.finished else None}
        return [self._chunk([self._with_ids(choice, out.new_token_ids)], last=last)]

    def tail(self) -> list[str]:
        if not self.include_usage:
            return []
        return [self._chunk([], last=True, usage=self.run.state.usage())]
