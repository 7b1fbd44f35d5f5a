"""Pieces shared by the chat and text-completion handlers: body parsing, model check, SSE,
running a response to its end while watching for a client disconnect."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import aclosing
from typing import Any, AsyncIterator, Callable, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from mtpserve.engine.async_engine import AsyncEngine, EngineDeadError
from mtpserve.server.errors import APIError, bad_request, from_validation_errors
from mtpserve.server.fanout import ChoiceRequest, merged_outputs
from mtpserve.server.metrics import ServerMetrics
from mtpserve.server.results import ResponseState, engine_unavailable

M = TypeVar("M", bound=BaseModel)
DONE = "data: [DONE]\n\n"


async def parse_body(request: Request, model: type[M]) -> M:
    """Read the body as UTF-8 JSON and validate it against ``model``.

    Raises:
        APIError: 400 for a body that is not UTF-8, not JSON (also: an integer too long for
            Python to convert, nesting too deep to decode), not an object, or fails validation.
    """
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not valid UTF-8 (byte {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise bad_request("the request body is not valid JSON: nested too deeply") from None
    except ValueError as e:   # e.g. an integer of more than sys.get_int_max_str_digits() digits
        raise bad_request(f"the request body is not valid JSON: {str(e).split(';')[0]}") \
            from None
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise from_validation_errors(e.errors(), model) from None


def check_model(requested: str | None, served: str) -> None:
    """Raises APIError 404 (``model_not_found``) unless ``requested`` is None or ``served``."""
    if requested is not None and requested != served:
        raise APIError(404, f"The model `{requested}` does not exist; this server serves "
                       f"`{served}`.", param="model", code="model_not_found")


def encode_text(tokenizer, text: str, param: str, add_special_tokens: bool) -> list[int]:
    """Token ids of ``text``.

    Raises:
        APIError: 400 when ``text`` is not valid Unicode (JSON can carry a lone UTF-16
            surrogate such as ``"\\ud800"``, which no tokenizer accepts).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_request(f"{param} is not valid Unicode: {e.reason} at character {e.start} "
                          f"(a lone UTF-16 surrogate?)", param=param) from None
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def with_token_ids(choice: dict, token_ids: list[int] | None) -> dict:
    """Add vLLM's ``token_ids`` extension to a choice when it was asked for."""
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    return choice


def sse(obj: dict) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def error_event(e: BaseException) -> str:
    """The SSE event for an error raised after the stream began (status already sent)."""
    if isinstance(e, APIError):
        return sse(e.body())
    if isinstance(e, EngineDeadError):
        return sse(engine_unavailable(str(e)).body())
    return sse(APIError(500, f"internal server error: {type(e).__name__}: {e}",
                        type="server_error").body())


class Run:
    """One response's engine work: the choice requests, their folded state and timing."""

    def __init__(self, engine: AsyncEngine, metrics: ServerMetrics, reqs: list[ChoiceRequest],
                 n: int, arrival: float):
        self.engine = engine
        self.metrics = metrics
        self.reqs = reqs
        self.state = ResponseState(reqs, n)
        self.arrival = arrival
        self.created = int(time.time())

    def outputs(self):
        """Merged ``(index, delta)`` stream (use with ``contextlib.aclosing``)."""
        return merged_outputs(self.engine, self.reqs, self.metrics, self.arrival)

    async def collect(self, request: Request) -> ResponseState:
        """Run every choice to the end; abort them if the client disconnects first.

        Raises:
            APIError: 503 when the engine is not running; 400 when it rejected a request;
                499 when the client went away.
        """
        async def work() -> None:
            async with aclosing(self.outputs()) as gen:
                async for index, out in gen:
                    self.state.add(index, out, out.error is None or self.engine.alive)

        task = asyncio.create_task(work())
        watcher = asyncio.create_task(_wait_disconnect(request))
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not task.done():
                task.cancel()
            await asyncio.gather(task, watcher, return_exceptions=True)
        if task.cancelled():
            raise APIError(499, "client closed the request", code="client_closed_request")
        err = task.exception()
        if isinstance(err, EngineDeadError):
            raise engine_unavailable(str(err))
        if err is not None:
            raise err
        return self.state

    async def stream(self, render: Callable[[int, Any], list[str]],
                     head: list[str], tail: Callable[[], list[str]]) -> AsyncIterator[str]:
        """SSE stream: ``head`` events, ``render(index, delta)`` per delta, ``tail()`` events, then
        ``[DONE]``. An error after the start becomes an error event before ``[DONE]``."""
        try:
            for ev in head:
                yield ev
            async with aclosing(self.outputs()) as gen:
                async for index, out in gen:
                    self.state.add(index, out, out.error is None or self.engine.alive)
                    for ev in render(index, out):
                        yield ev
            for ev in tail():
                yield ev
        except Exception as e:  # noqa: BLE001 - reported in-band: the status is already sent
            yield error_event(e)
        yield DONE


async def _wait_disconnect(request: Request) -> None:
    """Return once the client has disconnected (the body must already be read)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return
