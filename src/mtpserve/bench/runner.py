"""A benchmark run: for each server configuration (one, or speculation off then on), get a
server (the given URL, or a ``mtpserve serve`` subprocess), warm it up, and run every
concurrency level against it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterator

import httpx

from mtpserve.bench.client import RequestSpec
from mtpserve.bench.dataset import BenchPrompt
from mtpserve.bench.errors import BenchError
from mtpserve.bench.load import LoadPlan, run_level, warm_up
from mtpserve.bench.server_metrics import counters_delta, scrape_spec_counters
from mtpserve.bench.server_proc import ServerProcess
from mtpserve.bench.stats import summarize
from mtpserve.server.wait_ready import EXIT_READY, wait_ready


@dataclass(frozen=True)
class BenchOptions:
    """Everything but the server: prompts, levels, load and request shape.

    ``request``: a RequestSpec whose ``model`` is a placeholder unless ``model_name`` is set
    (else the server's first /v1/models id is used). Timeouts are seconds.
    """

    prompts: list[BenchPrompt]
    concurrencies: tuple[int, ...]
    load: LoadPlan
    request: RequestSpec
    model_name: str | None = None
    warmup: int = 1
    api_key: str | None = None
    request_timeout_s: float = 600.0
    ready_timeout_s: float = 600.0
    output_dir: str | None = None


@dataclass(frozen=True)
class RunPlan:
    """One server configuration: ``label`` (e.g. ``spec off``), and either ``server_flags`` for
    a self-started server or ``url`` of a running one."""

    label: str
    server_flags: list[str] | None = None
    url: str | None = None
    info: dict = field(default_factory=dict)


Launcher = Callable[[RunPlan, BenchOptions], ContextManager[str]]


@contextlib.contextmanager
def default_launcher(plan: RunPlan, opts: BenchOptions) -> Iterator[str]:
    """Yield the base URL: ``plan.url`` once it is ready, or a started ``ServerProcess``'s."""
    if plan.server_flags is None:
        check_external(plan.url, opts.ready_timeout_s, opts.api_key)
        yield plan.url
        return
    log = None
    if opts.output_dir:
        log = os.path.join(opts.output_dir, f"server-{plan.label.replace(' ', '-')}.log")
    with ServerProcess(plan.server_flags, ready_timeout_s=opts.ready_timeout_s, log_path=log,
                       api_key=opts.api_key) as srv:
        yield srv.url


def check_external(url: str, ready_timeout_s: float, api_key: str | None) -> None:
    """Fail fast when nothing answers at ``url``; else wait (up to ``ready_timeout_s``) until its
    /health is ready and the key is accepted.

    Raises:
        BenchError: connection refused / unreachable, not ready in time, engine dead, key refused.
    """
    out = io.StringIO()
    try:
        httpx.get(url.rstrip("/") + "/health", timeout=10.0)
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach the server at {url}: {type(e).__name__}: {e}") from None
    if wait_ready(url, ready_timeout_s, api_key=api_key, out=out) != EXIT_READY:
        raise BenchError(out.getvalue().strip())


async def discover_model(client: httpx.AsyncClient) -> str:
    """The first model id of ``GET /v1/models``; raises ``BenchError`` when there is none."""
    try:
        r = await client.get("/v1/models")
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
        raise BenchError(f"cannot read the model id from /v1/models: {e}") from None


async def bench_server(url: str, opts: BenchOptions, label: str) -> dict:
    """Warm up, then run each level against the server at ``url``.

    Returns ``{"label", "url", "model", "levels": [{"concurrency", "summary", "requests"}]}``;
    each summary (see ``stats.summarize``) also has ``metrics_spec``: the /metrics counter
    deltas over the level (None without speculative counters), whose acceptance length stands
    in when the responses carry no ``mtpserve.spec``.
    """
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    limits = httpx.Limits(max_connections=max(opts.concurrencies) + 4)
    timeout = httpx.Timeout(opts.request_timeout_s, connect=30.0)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits,
                                 timeout=timeout) as client:
        model = opts.model_name or await discover_model(client)
        spec = RequestSpec(model=model, endpoint=opts.request.endpoint,
                           output_len=opts.request.output_len,
                           max_tokens=opts.request.max_tokens,
                           temperature=opts.request.temperature)
        await warm_up(client, spec, opts.prompts, opts.warmup)
        levels = []
        for c in opts.concurrencies:
            before = await scrape_spec_counters(client)
            records, wall = await run_level(client, spec, opts.prompts, c, opts.load, label)
            summary = summarize(records, wall, c)
            summary["metrics_spec"] = delta = counters_delta(
                before, await scrape_spec_counters(client))
            if summary["acceptance_length"] is None and delta is not None:
                summary["acceptance_length"] = delta["acceptance_length"]
            levels.append({"concurrency": c, "summary": summary,
                           "requests": [r.to_dict() for r in records]})
    return {"label": label, "url": url, "model": model, "levels": levels}


def run_plans(plans: list[RunPlan], opts: BenchOptions, launcher: Launcher = default_launcher,
              on_run: Callable[[dict], None] | None = None) -> list[dict]:
    """Run every plan in order (one server at a time); ``on_run`` sees each finished run.

    Returns one dict a plan: ``bench_server``'s result plus ``server_flags`` and ``info``.

    Raises:
        BenchError: a server could not be reached / started, or warm-up failed.
    """
    runs = []
    for plan in plans:
        with launcher(plan, opts) as url:
            run = asyncio.run(bench_server(url, opts, plan.label))
        run.update(server_flags=plan.server_flags, **plan.info)
        runs.append(run)
        if on_run is not None:
            on_run(run)
    return runs
