"""Load generation: keep C requests in flight until N are done, optionally with Poisson arrivals.

For each concurrency C, ``num_prompts`` requests cycle through the prompts (request i sends
prompt i mod len(prompts)). Without a request rate all are submitted at once and a semaphore
keeps C in flight; with rate R, arrivals are a Poisson process (exponential gaps of mean 1/R s,
seeded) and still at most C are in flight. A request's timing starts when it is sent, not when
it arrives (time waiting for a free slot is client-side queueing, not server latency).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass

import httpx
from tqdm import tqdm

from mtpserve.bench.client import RequestRecord, RequestSpec, send_request
from mtpserve.bench.dataset import BenchPrompt
from mtpserve.bench.errors import BenchError


@dataclass(frozen=True)
class LoadPlan:
    """``num_prompts`` requests per level; ``request_rate`` in requests/s (None: no pacing);
    ``seed`` of the arrival times; ``progress``: tqdm bars on stderr."""

    num_prompts: int
    request_rate: float | None = None
    seed: int = 0
    progress: bool = True


async def run_level(client: httpx.AsyncClient, spec: RequestSpec, prompts: list[BenchPrompt],
                    concurrency: int, plan: LoadPlan,
                    label: str = "") -> tuple[list[RequestRecord], float]:
    """Run one level; returns the records (in request order) and the wall time in seconds from
    the first send to the last response's end."""
    sem = asyncio.Semaphore(concurrency)
    rng = random.Random(plan.seed)
    records = [RequestRecord(index=i, prompt_index=i % len(prompts))
               for i in range(plan.num_prompts)]
    bar = tqdm(total=len(records), desc=f"{label} c={concurrency}".strip(), unit="req",
               file=sys.stderr, disable=not plan.progress, dynamic_ncols=True)

    async def one(rec: RequestRecord) -> None:
        async with sem:
            await send_request(client, spec, prompts[rec.prompt_index], rec, t0)
        bar.update(1)

    t0 = time.perf_counter()
    tasks = []
    try:
        for rec in records:
            if plan.request_rate and tasks:
                await asyncio.sleep(rng.expovariate(plan.request_rate))
            tasks.append(asyncio.create_task(one(rec)))
        await asyncio.gather(*tasks)
    finally:
        bar.close()
    return records, time.perf_counter() - t0


async def warm_up(client: httpx.AsyncClient, spec: RequestSpec, prompts: list[BenchPrompt],
                  count: int) -> None:
    """Send ``count`` requests one after the other (not measured).

    Raises:
        BenchError: a warm-up request failed (wrong model name, endpoint, auth, ...); the message
            carries the server's answer.
    """
    for i in range(count):
        rec = await send_request(client, spec, prompts[i % len(prompts)],
                                 RequestRecord(index=-1, prompt_index=i % len(prompts)),
                                 time.perf_counter())
        if not rec.ok:
            raise BenchError(f"warm-up request failed: {rec.error}")
