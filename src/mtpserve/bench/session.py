"""From ``mtpserve bench`` flags to the run plans and options, and a whole session: the runs,
the tables on stdout, ``results.json`` and ``results.png``."""

from __future__ import annotations

import argparse
import os
import sys

from mtpserve.bench.client import RequestSpec
from mtpserve.bench.compare import compare_runs
from mtpserve.bench.dataset import BenchPrompt, builtin_prompts, load_jsonl
from mtpserve.bench.load import LoadPlan
from mtpserve.bench.runner import BenchOptions, RunPlan, default_launcher, run_plans
from mtpserve.bench.server_flags import has_spec_flags, parse_serve_flags, strip_spec_flags
from mtpserve.server.wait_ready import health_url

PRIVATE = ("func", "api_key")


def load_prompts(a: argparse.Namespace) -> list[BenchPrompt]:
    """The prompt set or JSONL file of ``a``; raises ``ValueError`` for a chat-list prompt on
    the completions endpoint (and see ``dataset.load_jsonl``)."""
    prompts = load_jsonl(a.dataset) if a.dataset else builtin_prompts(a.prompt_set)
    if a.endpoint == "completions":
        for p in prompts:
            p.completion_prompt()
    return prompts


def _model_path(flags: list[str]) -> str | None:
    ns = parse_serve_flags(flags)
    if ns.model or ns.model_pos:
        return ns.model or ns.model_pos
    from mtpserve.loader import default_model_path
    try:
        return default_model_path()
    except FileNotFoundError:
        return None


def _without_flag(flags: list[str], name: str) -> list[str]:
    """``flags`` without ``name`` and its value (``--name v`` or ``--name=v``)."""
    out, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag == name:
            skip = True
        elif not flag.startswith(name + "="):
            out.append(flag)
    return out


def make_plans(a: argparse.Namespace) -> list[RunPlan]:
    """One plan (``--url`` or a started server) or two (``--compare``: spec off, spec on).

    With ``--rounds`` > 1 both servers run at once, each with ``--gpu-memory-utilization``
    half the given value (default 0.9).

    Raises:
        ValueError: server flags or ``--compare`` with ``--url``; ``--compare`` without a
            ``--speculative-algorithm``; ``--rounds`` without ``--compare``; server flags that
            ``mtpserve serve`` rejects.
    """
    if a.rounds > 1 and not a.compare:
        raise ValueError("--rounds takes turns between the two servers of --compare")
    flags = list(a.server_args)
    if a.url:
        if flags:
            raise ValueError("flags after -- are for a server the benchmark starts; "
                             "leave out --url to start one")
        if a.compare:
            raise ValueError("--compare starts its two servers itself; leave out --url")
        return [RunPlan("server", url=health_url(a.url)[: -len("/health")])]
    flags = (["--model", a.model] if a.model else []) + flags
    spec_on = has_spec_flags(flags)
    info = {"model_path": _model_path(flags)}
    if not a.compare:
        return [RunPlan("spec on" if spec_on else "spec off", server_flags=flags, info=info)]
    if not spec_on:
        raise ValueError("--compare needs speculative server flags, e.g. "
                         "`-- --speculative-algorithm ngram`")
    off, on = strip_spec_flags(flags), flags
    if a.rounds > 1:   # both up at once: each takes half the GPU memory budget
        half = ["--gpu-memory-utilization",
                f"{parse_serve_flags(flags).gpu_memory_utilization / 2:g}"]
        off, on = _without_flag(off, half[0]) + half, _without_flag(on, half[0]) + half
    return [RunPlan("spec off", server_flags=off, info=info),
            RunPlan("spec on", server_flags=on, info=info)]


def make_options(a: argparse.Namespace) -> BenchOptions:
    """The ``BenchOptions`` of ``a`` (prompts loaded); raises as ``load_prompts``."""
    request = RequestSpec(model="", endpoint=a.endpoint, output_len=a.output_len,
                          max_tokens=a.max_tokens, temperature=a.temperature)
    load = LoadPlan(num_prompts=a.num_prompts, request_rate=a.request_rate, seed=a.seed,
                    progress=not a.no_progress)
    return BenchOptions(prompts=load_prompts(a), concurrencies=tuple(a.concurrency), load=load,
                        request=request, model_name=a.model_name, warmup=max(0, a.warmup),
                        api_key=a.api_key, request_timeout_s=a.request_timeout,
                        ready_timeout_s=a.ready_timeout,
                        output_dir=os.path.abspath(a.output_dir) if a.output_dir else None)


def plan_from_args(a: argparse.Namespace) -> tuple[list[RunPlan], BenchOptions]:
    """Check every flag and load the prompts before any server starts."""
    return make_plans(a), make_options(a)


def bench_config(a: argparse.Namespace) -> dict:
    """The flags as recorded in results.json (without the API key)."""
    config = {k: v for k, v in vars(a).items() if k not in PRIVATE}
    if a.dataset:
        config["prompt_set"] = None
    return config


def run_session(a: argparse.Namespace, plans: list[RunPlan], opts: BenchOptions,
                launcher=None) -> int:
    """Run the plans, print the tables, write the results; returns 0, or 1 if any request
    failed. Raises ``BenchError`` (see ``runner.run_plans``)."""
    from mtpserve.bench.meta import run_metadata
    from mtpserve.bench.report import compare_table, run_table

    meta = run_metadata()
    if opts.output_dir:
        os.makedirs(opts.output_dir, exist_ok=True)
    runs = run_plans(plans, opts, launcher or default_launcher,
                     on_run=lambda run: print(run_table(run) + "\n", flush=True),
                     rounds=a.rounds)
    comparison = compare_runs(runs[0], runs[1]) if len(runs) == 2 else None
    if comparison is not None:
        print(compare_table(comparison) + "\n", flush=True)
    if opts.output_dir:
        _write_outputs(opts.output_dir, bench_config(a), meta, runs, comparison)
    failed = sum(lv["summary"]["num_errors"] for run in runs for lv in run["levels"])
    if failed:
        first = next(r["error"] for run in runs for lv in run["levels"]
                     for r in lv["requests"] if r["error"])
        print(f"mtpserve bench: {failed} request(s) failed; first error: {first}",
              file=sys.stderr)
        return 1
    return 0


def _write_outputs(output_dir: str, config: dict, meta: dict, runs: list[dict],
                   comparison: list[dict] | None) -> None:
    from mtpserve.bench.plot import plot_runs
    from mtpserve.bench.results import results_doc, write_json

    path = write_json(results_doc(config, meta, runs, comparison), output_dir)
    png = os.path.join(output_dir, "results.png")
    title = f"{runs[0]['model']}, {config.get('prompt_set') or config.get('dataset')}"
    try:
        plot_runs(runs, png, title)
    except ImportError:
        png = "(no plot: matplotlib is missing; pip install 'mtpserve[bench]')"
    print(f"results: {path}\nplot:    {png}")
