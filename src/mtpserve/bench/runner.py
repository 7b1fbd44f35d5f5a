"""A benchmark run: for each server configuration (one, or speculation off then on), get a
server (the given URL, or a ``mtpserve serve`` subprocess), warm it up, and run every
concurrency level against it.

With ``rounds`` > 1 every server is up at once and each level runs ``rounds`` times per server,
the servers taking turns in the order A B, B A, A B, ... (so a drift of the machine over the
run weighs on both alike): on the H200 two back-to-back ``--compare`` runs of the same code
differed by 26% in the speculation-off server's total tok/s at 64 requests (session 13), more
than the effects being measured. Each level then reports its pooled summary (all rounds'
requests over their summed wall time) and every round's own summary.
"""

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


@dataclass
class _Target:
    """One server under test: its label, URL, client and request shape."""

    label: str
    url: str
    client: httpx.AsyncClient
    spec: RequestSpec


async def _open(stack: contextlib.AsyncExitStack, url: str, opts: BenchOptions,
                label: str) -> _Target:
    """A client for the server at ``url`` (closed with ``stack``), its model found and the
    server warmed up."""
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    limits = httpx.Limits(max_connections=max(opts.concurrencies) + 4)
    timeout = httpx.Timeout(opts.request_timeout_s, connect=30.0)
    client = await stack.enter_async_context(httpx.AsyncClient(
        base_url=url, headers=headers, limits=limits, timeout=timeout))
    model = opts.model_name or await discover_model(client)
    spec = RequestSpec(model=model, endpoint=opts.request.endpoint,
                       output_len=opts.request.output_len, max_tokens=opts.request.max_tokens,
                       temperature=opts.request.temperature)
    await warm_up(client, spec, opts.prompts, opts.warmup)
    return _Target(label, url, client, spec)


def _level(c: int, rounds: list[tuple[list, float]], before: dict | None,
           after: dict | None) -> dict:
    """A level's result from its rounds' (records, wall seconds): the pooled summary with the
    /metrics counter deltas ``after - before`` (``metrics_spec``, whose acceptance length
    stands in when the responses carry no ``mtpserve.spec``), every request (with its round
    when there are several) and, for several rounds, each round's summary."""
    records = [r for recs, _ in rounds for r in recs]
    summary = summarize(records, sum(wall for _, wall in rounds), c)
    summary["metrics_spec"] = delta = counters_delta(before, after)
    if summary["acceptance_length"] is None and delta is not None:
        summary["acceptance_length"] = delta["acceptance_length"]
    level = {"concurrency": c, "summary": summary}
    if len(rounds) == 1:
        level["requests"] = [r.to_dict() for r in records]
        return level
    level["requests"] = [dict(r.to_dict(), round=k) for k, (recs, _) in enumerate(rounds)
                         for r in recs]
    level["rounds"] = [summarize(recs, wall, c) for recs, wall in rounds]
    return level


async def bench_servers(urls: list[str], opts: BenchOptions, labels: list[str],
                        rounds: int = 1) -> list[dict]:
    """Warm up each server, then run each level ``rounds`` times against each, the servers
    taking turns (A B, then B A, ...; see the module docstring).

    Returns per server ``{"label", "url", "model", "levels": [{"concurrency", "summary",
    "requests"[, "rounds"]}]}``; each summary (see ``stats.summarize``) also has
    ``metrics_spec`` (see ``_level``).

    Raises:
        BenchError: warm-up failed, or every request of one server's run of a level failed (a
            server that died, or one that refuses every request): no table is made of that.
    """
    async with contextlib.AsyncExitStack() as stack:
        targets = [await _open(stack, url, opts, label) for url, label in zip(urls, labels)]
        levels: list[list[dict]] = [[] for _ in targets]
        for c in opts.concurrencies:
            before = [await scrape_spec_counters(t.client) for t in targets]
            done: list[list[tuple[list, float]]] = [[] for _ in targets]
            for k in range(rounds):
                order = range(len(targets)) if k % 2 == 0 else reversed(range(len(targets)))
                for i in order:
                    t = targets[i]
                    records, wall = await run_level(t.client, t.spec, opts.prompts, c,
                                                    opts.load, t.label)
                    if records and not any(r.ok for r in records):
                        raise BenchError(f"every request to the {t.label} server ({t.url}) at "
                                         f"concurrency {c} failed; the first: "
                                         f"{records[0].error}")
                    done[i].append((records, wall))
            for i, t in enumerate(targets):
                levels[i].append(_level(c, done[i], before[i],
                                        await scrape_spec_counters(t.client)))
    return [{"label": t.label, "url": t.url, "model": t.spec.model, "levels": lv}
            for t, lv in zip(targets, levels)]


async def bench_server(url: str, opts: BenchOptions, label: str) -> dict:
    """Warm up, then run each level once against the server at ``url`` (``bench_servers``'s
    result for this one server)."""
    return (await bench_servers([url], opts, [label]))[0]


def run_plans(plans: list[RunPlan], opts: BenchOptions, launcher: Launcher = default_launcher,
              on_run: Callable[[dict], None] | None = None, rounds: int = 1) -> list[dict]:
    """Run every plan: with ``rounds`` 1 in order, one server at a time; else all servers up
    at once (started in plan order), their levels in turns (``bench_servers``). ``on_run`` sees
    each finished run.

    Returns one dict a plan: ``bench_server``'s result plus ``server_flags`` and ``info``.

    Raises:
        BenchError: a server could not be reached / started, or warm-up failed.
    """
    if rounds > 1:
        with contextlib.ExitStack() as stack:
            urls = [stack.enter_context(launcher(plan, opts)) for plan in plans]
            runs = asyncio.run(bench_servers(urls, opts, [p.label for p in plans], rounds))
        for run, plan in zip(runs, plans):
            run.update(server_flags=plan.server_flags, **plan.info)
            if on_run is not None:
                on_run(run)
        return runs
    runs = []
    for plan in plans:
        with launcher(plan, opts) as url:
            run = asyncio.run(bench_server(url, opts, plan.label))
        run.update(server_flags=plan.server_flags, **plan.info)
        runs.append(run)
        if on_run is not None:
            on_run(run)
    return runs
