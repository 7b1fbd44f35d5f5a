"""POST /v1/chat/completions: messages -> chat template -> engine -> chat.completion(.chunk)."""

from __future__ import annotations

import time
from typing import Any, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from mtpserve.engine.async_engine import AsyncEngine
from mtpserve.outputs import RequestOutput
from mtpserve.server.errors import bad_request
from mtpserve.server.fanout import fan_out
from mtpserve.server.logprobs import TokenStrings, chat_logprobs
from mtpserve.server.metrics import ServerMetrics
from mtpserve.server.model_context import ModelContext
from mtpserve.server.protocol import MAX_TOP_LOGPROBS, ChatCompletionRequest, ChatMessage
from mtpserve.server.sampling import fit_context, sampling_params
from mtpserve.server.serving_common import (Run, check_model, encode_text, new_id, sse,
                                            with_token_ids)

ROLES = ("system", "developer", "user", "assistant", "tool")


def message_dicts(messages: list[ChatMessage]) -> list[dict]:
    """Messages as the chat template expects them (``developer`` becomes ``system``).

    Raises:
        APIError: 400 for no messages, an unknown role, or content that is not text.
    """
    if not messages:
        raise bad_request("messages must contain at least one message", param="messages")
    out = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise bad_request(f"unknown role {m.role!r} in messages[{i}]; expected one of "
                              f"{', '.join(ROLES)}", param=f"messages[{i}].role")
        d = {"role": "system" if m.role == "developer" else m.role,
             "content": _content_text(m.content, i, m.role)}
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def _content_text(content: Any, i: int, role: str) -> str:
    param = f"messages[{i}].content"
    if isinstance(content, str):
        return content
    if content is None:
        if role == "assistant":
            return ""
        raise bad_request(f"{param} is required for role {role!r}", param=param)
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise bad_request(f"{param}[{j}] must be a text part "
                                  '({"type": "text", "text": "..."}); only text is supported',
                                  param=f"{param}[{j}]")
            texts.append(part["text"])
        return "\n".join(texts)
    raise bad_request(f"{param} must be a string or a list of text parts", param=param)


def chat_prompt_ids(ctx: ModelContext, req: ChatCompletionRequest) -> list[int]:
    """Token ids of the rendered chat template (``add_generation_prompt=True`` by default).

    Raises:
        APIError: 400 when the messages are bad, the model has no chat template, or the template
            rejects the conversation.
    """
    msgs = message_dicts(req.messages)
    tok = ctx.tokenizer
    if not getattr(tok, "chat_template", None):
        raise bad_request("this model has no chat template; use /v1/completions",
                          param="messages")
    try:
        text = tok.apply_chat_template(msgs, add_generation_prompt=req.add_generation_prompt,
                                       tokenize=False)
    except Exception as e:  # noqa: BLE001 - jinja2 raises many types for template errors
        raise bad_request(f"the chat template rejected the messages: {e}",
                          param="messages") from None
    return encode_text(tok, text, "messages", add_special_tokens=False)


def _check_unsupported(req: ChatCompletionRequest) -> None:
    if req.tools:
        raise bad_request("tools are not supported by this server", param="tools")
    if req.tool_choice not in (None, "none"):
        raise bad_request("tool_choice is not supported by this server", param="tool_choice")
    if req.response_format is not None and req.response_format.get("type") != "text":
        raise bad_request("only response_format {\"type\": \"text\"} is supported",
                          param="response_format")
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
        if not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got "
                              f"{req.top_logprobs}", param="top_logprobs")


class ChatServing:
    """Handler of /v1/chat/completions over one engine."""

    def __init__(self, engine: AsyncEngine, metrics: ServerMetrics,
                 strings_for: Callable[[ModelContext], TokenStrings]):
        self.engine = engine
        self.metrics = metrics
        self._strings_for = strings_for

    async def create(self, req: ChatCompletionRequest, ctx: ModelContext, request: Request):
        """Validate, run and answer one chat request (JSON, or SSE when ``stream``).

        Raises:
            APIError: 400 / 404 for bad input (see ``api.py``), 503 when the engine is down.
        """
        arrival = time.perf_counter()
        check_model(req.model, ctx.name)
        _check_unsupported(req)
        use_mct = req.max_completion_tokens is not None
        mt_name = "max_completion_tokens" if use_mct else "max_tokens"
        params = sampling_params(
            req, max_tokens=req.max_completion_tokens if use_mct else req.max_tokens,
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            vocab_size=ctx.vocab_size, rename={"logprobs": "top_logprobs", "max_tokens": mt_name})
        ids = chat_prompt_ids(ctx, req)
        fit_context(params, len(ids), ctx.max_model_len, prompt_param="messages",
                    max_tokens_param=mt_name)
        rid = new_id("chatcmpl")
        run = Run(self.engine, self.metrics, fan_out(rid, [ids], [params]), params.n, arrival)
        fmt = _ChatFormat(run, rid, ctx.name, self._strings_for(ctx) if req.logprobs else None,
                          bool(req.stream_options and req.stream_options.include_usage),
                          bool(req.return_token_ids))
        if req.stream:
            return StreamingResponse(run.stream(fmt.render, fmt.head(), fmt.tail),
                                     media_type="text/event-stream")
        await run.collect(request)
        return JSONResponse(fmt.response())


class _ChatFormat:
    """Builds the chat.completion object and the chat.completion.chunk events of one run."""

    def __init__(self, run: Run, rid: str, model: str, strings: TokenStrings | None,
                 include_usage: bool, token_ids: bool = False):
        self.run, self.rid, self.model = run, rid, model
        self.token_ids = token_ids
        self.strings = strings
        self.include_usage = include_usage
        self._open = len(run.reqs)

    def _base(self, obj: str) -> dict:
        return {"id": self.rid, "object": obj, "created": self.run.created, "model": self.model}

    def response(self) -> dict:
        st = self.run.state
        body = self._base("chat.completion")
        body["choices"] = [with_token_ids({
            "index": c.index, "message": {"role": "assistant", "content": c.text},
            "logprobs": chat_logprobs(self.strings, c.logprobs or []) if self.strings else None,
            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason},
            c.token_ids if self.token_ids else None) for c in st.choices]
        body["usage"] = st.usage()
        self._add_prompt_ids(body)
        ext = st.extension()
        if ext is not None:
            body["mtpserve"] = ext
        return body

    def _add_prompt_ids(self, body: dict) -> None:
        """vLLM's ``prompt_token_ids`` (the one prompt of a chat request) when token ids were
        asked for."""
        if self.token_ids:
            body["prompt_token_ids"] = list(self.run.reqs[0].prompt_token_ids)

    def _chunk(self, choices: list[dict], last: bool = False, usage: dict | None = None,
               first: bool = False) -> str:
        body = self._base("chat.completion.chunk")
        body["choices"] = choices
        if first:
            self._add_prompt_ids(body)
        if self.include_usage:
            body["usage"] = usage
        ext = self.run.state.extension() if last else None
        if ext is not None:
            body["mtpserve"] = ext
        return sse(body)

    def head(self) -> list[str]:
        return [self._chunk([{"index": r.index, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}], first=True)
                for r in self.run.reqs]

    def render(self, index: int, out: RequestOutput) -> list[str]:
        lp = (chat_logprobs(self.strings, out.new_logprobs)
              if self.strings is not None and out.new_logprobs else None)
        ids = out.new_token_ids if self.token_ids else None
        if not (out.new_text or out.finished or lp is not None or ids):
            return []
        delta = {"content": out.new_text} if out.new_text or lp is not None else {}
        self._open -= out.finished
        last = out.finished and self._open == 0 and not self.include_usage
        choice = {"index": index, "delta": delta, "logprobs": lp,
                  "finish_reason": out.finish_reason if out.finished else None,
                  "stop_reason": out.stop_reason if out.finished else None}
        return [self._chunk([with_token_ids(choice, ids)], last=last)]

    def tail(self) -> list[str]:
        if not self.include_usage:
            return []
        return [self._chunk([], last=True, usage=self.run.state.usage())]
