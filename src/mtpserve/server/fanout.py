"""Fan one API request out into engine requests (``n`` choices, several prompts) and merge them.

Each choice is one engine request with id ``f"{request_id}-{index}"``. Their output streams are
pumped by one task each into a shared queue, so the merged stream yields ``(index, output)`` in
the order the engine produced them; a single choice (most requests) is its own stream, without
the task and the queue. Closing the merged stream (client disconnect) cancels the pumps, which
closes each engine stream and so aborts the engine requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import AsyncIterator

from mtpserve.engine.async_engine import AsyncEngine
from mtpserve.outputs import RequestOutput
from mtpserve.sampling_params import SamplingParams
from mtpserve.server.metrics import ServerMetrics


@dataclass
class ChoiceRequest:
    """One engine request: choice ``index`` of the response, on ``prompt_token_ids``."""

    index: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


def fan_out(request_id: str, prompts: list[list[int]],
            params: list[SamplingParams]) -> list[ChoiceRequest]:
    """``len(prompts) * n`` choice requests; choice ``p * n + i`` is completion i of prompt p.

    ``params[p]`` are prompt p's settings (all with the same ``n``). Each engine request gets
    ``n = 1``; with a ``seed``, completion i uses ``seed + i`` (so a prompt's completions differ,
    and completion 0 equals the same request with ``n = 1``).
    """
    reqs = []
    for p, (ids, sp) in enumerate(zip(prompts, params, strict=True)):
        for i in range(sp.n):
            seed = None if sp.seed is None else sp.seed + i
            one = dataclasses.replace(sp, n=1, seed=seed, stop=list(sp.stop),
                                      stop_token_ids=list(sp.stop_token_ids))
            idx = p * sp.n + i
            reqs.append(ChoiceRequest(idx, f"{request_id}-{idx}", ids, one))
    return reqs


async def merged_outputs(engine: AsyncEngine, reqs: list[ChoiceRequest],
                         metrics: ServerMetrics | None = None,
                         arrival: float | None = None) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Yield ``(choice index, delta)`` from all ``reqs`` until every one has finished.

    Raises:
        EngineDeadError: the engine is not running or died (other choices are aborted).
    """
    arrival = time.perf_counter() if arrival is None else arrival
    if len(reqs) == 1:   # one choice (most requests): its stream as is, no pump and queue
        async with aclosing(_one(engine, reqs[0], metrics, arrival)) as outs:
            async for out in outs:
                yield reqs[0].index, out
        return
    queue: asyncio.Queue = asyncio.Queue()
    tasks = [asyncio.create_task(_pump(engine, r, queue, metrics, arrival)) for r in reqs]
    pending = len(tasks)
    try:
        while pending:
            index, out, err = await queue.get()
            if err is not None:
                raise err
            if out is None:
                pending -= 1
                continue
            yield index, out
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _one(engine: AsyncEngine, r: ChoiceRequest, metrics: ServerMetrics | None,
               arrival: float) -> AsyncIterator[RequestOutput]:
    """One choice's engine stream, tracked for the metrics; closing it aborts the request."""
    tracker = metrics.track(arrival) if metrics is not None else None
    stream = engine.generate(r.request_id, r.prompt_token_ids, r.params)
    try:
        async for out in stream:
            if tracker is not None:
                tracker.on_output(out)
            yield out
    finally:
        await stream.aclose()
        if tracker is not None:
            tracker.finish("abort")


async def _pump(engine: AsyncEngine, r: ChoiceRequest, queue: asyncio.Queue,
                metrics: ServerMetrics | None, arrival: float) -> None:
    """Forward one engine stream into ``queue``; a ``None`` output marks its end."""
    try:
        async with aclosing(_one(engine, r, metrics, arrival)) as outs:
            async for out in outs:
                queue.put_nowait((r.index, out, None))
        queue.put_nowait((r.index, None, None))
    except Exception as e:  # noqa: BLE001 - handed to the consumer
        queue.put_nowait((r.index, None, e))
