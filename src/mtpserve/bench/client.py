"""One streamed request against an OpenAI-compatible server, timed chunk by chunk.

Each request streams (``stream_options.include_usage``) and asks for vLLM's ``return_token_ids``
extension, so a chunk that carries several tokens (one speculative verify step can emit up to
k + 1) is counted exactly; a server that omits ``token_ids`` has every non-empty chunk counted as
one token. ``ignore_eos`` + ``max_tokens`` give a fixed output length.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import httpx

from mtpserve.bench.dataset import BenchPrompt


@dataclass(frozen=True)
class RequestSpec:
    """What every request of a run asks for.

    ``output_len``: exact completion length (sends ``ignore_eos``); None lets the model stop at
    EOS, capped at ``max_tokens``. ``endpoint``: ``chat`` or ``completions``.
    """

    model: str
    endpoint: str = "chat"
    output_len: int | None = None
    max_tokens: int = 256
    temperature: float = 0.0

    def body(self, prompt: BenchPrompt) -> dict:
        """The JSON body for ``prompt``; raises ``ValueError`` for a chat list on completions."""
        body = {"model": self.model, "stream": True, "temperature": self.temperature,
                "stream_options": {"include_usage": True}, "return_token_ids": True,
                "max_tokens": self.output_len or self.max_tokens}
        if self.output_len is not None:
            body["ignore_eos"] = True
        if self.endpoint == "chat":
            body["messages"] = prompt.chat_messages()
        else:
            body["prompt"] = prompt.completion_prompt()
        return body

    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"


@dataclass
class RequestRecord:
    """The timing of one request. Times are seconds: ``start`` since the start of its
    concurrency level, ``chunk_times`` since ``start``, one per chunk that carried tokens, with
    ``chunk_tokens`` tokens each. ``output_tokens`` is the server's ``usage.completion_tokens``
    (the streamed count when usage is missing). ``spec``: the ``mtpserve.spec`` stats, if any."""

    index: int
    prompt_index: int
    start: float = 0.0
    latency: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    spec: dict | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        """Seconds from sending to the first chunk with a token."""
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def streamed_tokens(self) -> int:
        return sum(self.chunk_tokens)

    def to_dict(self) -> dict:
        return asdict(self)


async def send_request(client: httpx.AsyncClient, spec: RequestSpec, prompt: BenchPrompt,
                       record: RequestRecord, t0: float) -> RequestRecord:
    """Stream one request and fill ``record`` (``t0``: the level's ``perf_counter`` origin).

    Never raises for server or network trouble: ``record.error`` says what went wrong (HTTP
    status and body, a connection error, an error event in the stream, or a stream without
    ``[DONE]``).
    """
    start = time.perf_counter()
    record.start = start - t0
    try:
        async with client.stream("POST", spec.path(), json=spec.body(prompt)) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode("utf-8", "replace")
                record.error = f"HTTP {r.status_code}: {text[:300]}"
                return record
            done = await _read_stream(r, record, start)
        if not done and record.error is None:
            record.error = "the stream ended without [DONE]"
    except httpx.HTTPError as e:
        record.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    record.latency = time.perf_counter() - start
    if not record.output_tokens:
        record.output_tokens = record.streamed_tokens
    return record


async def _read_stream(r: httpx.Response, record: RequestRecord, start: float) -> bool:
    async for line in r.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return True
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            record.error = f"a stream event that is not JSON: {data[:200]!r}"
            return False
        _take_chunk(chunk, record, time.perf_counter() - start)
        if record.error is not None:
            return False
    return False


def _take_chunk(chunk: dict, record: RequestRecord, now: float) -> None:
    if "error" in chunk:
        record.error = f"error event: {json.dumps(chunk['error'])[:300]}"
        return
    tokens = 0
    for choice in chunk.get("choices") or []:
        text = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
        ids = choice.get("token_ids")
        tokens += len(ids) if ids is not None else int(bool(text))
        record.finish_reason = choice.get("finish_reason") or record.finish_reason
    if tokens:
        record.chunk_times.append(now)
        record.chunk_tokens.append(tokens)
    usage = chunk.get("usage")
    if usage:
        record.output_tokens = usage.get("completion_tokens", 0)
        record.prompt_tokens = usage.get("prompt_tokens")
    ext = chunk.get("mtpserve")
    if isinstance(ext, dict) and isinstance(ext.get("spec"), dict):
        record.spec = ext["spec"]
