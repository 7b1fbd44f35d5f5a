"""``mtpserve bench`` against the real SmolLM2 model: an in-process server with the n-gram
proposer (k = 3; on the repetitive prompts some steps accept drafts, so chunks carry several
tokens) for --url runs, and self-started ``mtpserve serve`` subprocesses for --compare. Tiny
loads; exact counts."""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import signal
import socket
import sys

import httpx
import numpy as np
import pytest

from mtpserve.bench.client import RequestRecord, RequestSpec, send_request
from mtpserve.bench.dataset import BenchPrompt
from mtpserve.bench.load import LoadPlan, run_level
from mtpserve.bench.server_flags import strip_spec_flags
from mtpserve.bench.stats import percentile, summarize
from mtpserve.cli import main
from mtpserve.config import EngineConfig, SpeculativeConfig
from mtpserve.server.api import build_app, make_engine
from mtpserve.server.runner import BackgroundServer
from mtpserve.server.wait_ready import wait_ready

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SUMMARY_KEYS = {"concurrency", "num_requests", "num_errors", "wall_s", "output_tokens",
                "prompt_tokens", "request_rate", "per_request_tok_s", "total_tok_s", "ttft_ms",
                "itl_ms", "tpot_ms", "spec", "acceptance_length", "metrics_spec"}
QUIET = ["--no-progress"]


@pytest.fixture(scope="module")
def url():
    cfg = EngineConfig(max_model_len=256, num_kv_blocks=256,
                       speculative=SpeculativeConfig("ngram", num_steps=3))
    with BackgroundServer(build_app(make_engine(cfg))) as srv:
        log = io.StringIO()
        assert wait_ready(srv.url, 300, interval_s=0.1, out=log) == 0, log.getvalue()
        yield srv.url


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def load(out_dir) -> dict:
    with open(out_dir / "results.json", encoding="utf-8") as f:
        return json.load(f)


# --- flags and errors (no server) ---------------------------------------------------------

@pytest.mark.parametrize("value, says", [("1,x", "comma-separated integers"),
                                         ("4,0", "must be >= 1"), ("", "comma-separated")])
def test_bad_concurrency_is_rejected(value, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--concurrency", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --concurrency" in err and says in err


def test_unreachable_url_exits_1_with_the_reason(capsys):
    target = closed_port_url()
    assert main(["bench", "--url", target, *QUIET]) == 1
    err = capsys.readouterr().err
    assert f"mtpserve bench: cannot reach the server at {target}: ConnectError" in err


@pytest.mark.parametrize("argv, says", [
    (["--url", "http://127.0.0.1:1", "--compare"], "--compare starts its two servers itself"),
    (["--url", "http://127.0.0.1:1", "--", "--max-model-len", "64"], "leave out --url"),
    (["--compare"], "--compare needs speculative server flags"),
    (["--", "--port", "9000"], "leave out --port"),
    (["--", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--", "--speculative-algorithm", "magic"], "invalid choice: 'magic'"),
    (["--rounds", "2", "--", "--max-model-len", "64"], "--rounds takes turns between the two"),
])
def test_contradicting_flags_exit_2_before_any_server(argv, says, capsys):
    assert main(["bench", *QUIET, *argv]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("given, off_util", [([], "0.45"),
                                              (["--gpu-memory-utilization", "0.6"], "0.3"),
                                              (["--gpu-memory-utilization=0.5"], "0.25")])
def test_compare_in_rounds_gives_each_server_half_the_gpu_memory(given, off_util):
    from mtpserve.bench.session import make_plans

    flags = ["--speculative-algorithm", "ngram", *given]
    off, on = make_plans(main_parser_args(["--compare", "--rounds", "3", "--", *flags]))
    assert off.server_flags == ["--gpu-memory-utilization", off_util]
    assert on.server_flags == ["--speculative-algorithm", "ngram", "--gpu-memory-utilization",
                               off_util]
    assert make_plans(main_parser_args(["--compare", "--", *flags]))[0].server_flags == given


def test_sigterm_stops_the_started_servers_and_exits_143(monkeypatch, capsys):
    """SIGTERM in the middle of a run unwinds through the servers' context managers (the
    launcher's stop runs) and the CLI exits 143."""
    import contextlib

    from mtpserve.bench import runner

    events = []

    @contextlib.contextmanager
    def launcher(plan, opts):
        events.append(("start", plan.label))
        try:
            yield "http://127.0.0.1:1"
        finally:
            events.append(("stop", plan.label))

    async def terminated(*_a, **_k):
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(5)   # the handler raises before this ends

    monkeypatch.setattr(runner, "bench_servers", terminated)
    from mtpserve.bench.cli import run_bench

    a = main_parser_args(["--compare", "--rounds", "2", *QUIET, "--", "--speculative-algorithm",
                          "ngram"])
    before = signal.getsignal(signal.SIGTERM)
    assert run_bench(a, launcher) == 143
    assert events == [("start", "spec off"), ("start", "spec on"), ("stop", "spec on"),
                      ("stop", "spec off")]
    assert "mtpserve bench: terminated" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before


def _gone(pid: int) -> bool:
    """The process has exited (no /proc entry, or a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_started_server_dies_with_a_killed_benchmark():
    """The parent-death signal set for ``mtpserve serve`` children: SIGKILL a process that
    started a child that way, and the child gets SIGTERM."""
    import subprocess
    import time

    code = ("import subprocess, sys, time\n"
            "from mtpserve.parent_death import die_with_parent\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
            " preexec_fn=die_with_parent)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert not _gone(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(child)
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)


def test_a_level_whose_every_request_fails_stops_the_run(url):
    """A server that refuses every request (here: a model it does not serve, no warm-up) makes
    a BenchError that names the server and the first error, not a table of failures."""
    from mtpserve.bench import runner
    from mtpserve.bench.errors import BenchError
    from mtpserve.bench.session import make_options

    a = main_parser_args(["--prompt-set", "repetitive", "--concurrency", "2", "--num-prompts",
                          "2", "--output-len", "4", "--warmup", "0", "--model-name", "nope",
                          *QUIET])
    with pytest.raises(BenchError, match=r"every request to the spec off server .* at "
                                         r"concurrency 2 failed; the first: HTTP 404"):
        runner.run_plans([runner.RunPlan("spec off", url=url)], make_options(a))


def test_strip_spec_flags_drops_values_and_switches():
    flags = ["--max-model-len", "256", "--speculative-algorithm", "ngram",
             "--speculative-num-steps=5", "--no-speculative-adaptive", "--dtype", "float32",
             "--speculative-ngram-max", "3", "--speculative-adaptive", "--block-size", "32"]
    assert strip_spec_flags(flags) == ["--max-model-len", "256", "--dtype", "float32",
                                       "--block-size", "32"]


def test_jsonl_errors_name_the_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n\n{"text": "no prompt"}\n')
    assert main(["bench", "--dataset", str(path), *QUIET]) == 2
    assert f"{path}:3: needs \"prompt\"" in capsys.readouterr().err
    path.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert main(["bench", "--dataset", str(path), "--endpoint", "completions", *QUIET]) == 2
    assert "needs --endpoint chat" in capsys.readouterr().err


def test_summary_definitions_on_a_known_record():
    rec = RequestRecord(index=0, prompt_index=0, latency=1.0, chunk_times=[0.2, 0.5, 0.6, 0.9],
                        chunk_tokens=[1, 3, 1, 2], output_tokens=7,
                        spec={"num_draft_tokens": 6, "num_accepted_tokens": 4,
                              "num_verify_steps": 3})
    bad = RequestRecord(index=1, prompt_index=1, error="HTTP 500: boom", output_tokens=99)
    s = summarize([rec, bad], wall_s=2.0, concurrency=2)
    assert (s["num_requests"], s["num_errors"], s["output_tokens"]) == (2, 1, 7)
    assert s["total_tok_s"] == pytest.approx(7 / 2.0)
    assert s["per_request_tok_s"]["mean"] == pytest.approx(7 / 1.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["tpot_ms"]["p50"] == pytest.approx((0.9 - 0.2) / 6 * 1e3)
    gaps = [0.3, 0.1, 0.3]
    assert s["itl_ms"]["p50"] == pytest.approx(np.percentile(gaps, 50) * 1e3)
    assert s["itl_ms"]["p99"] == pytest.approx(np.percentile(gaps, 99) * 1e3)
    assert s["acceptance_length"] == pytest.approx((4 + 3) / 3)


@pytest.mark.parametrize("values", [[5.0], [3.0, 1.0, 2.0], list(np.linspace(0, 7, 13) ** 2)])
def test_percentile_matches_numpy(values):
    for q in (0, 1, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q))


# --- client and load against a scripted transport ------------------------------------------

def sse_body(events: list) -> bytes:
    return "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n"
                   for e in events).encode()


def chunk(content: str, ids: list[int] | None = None) -> dict:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": None}
    if ids is not None:
        choice["token_ids"] = ids
    return {"choices": [choice]}


def send_one(events: list, status: int = 200) -> tuple[RequestRecord, dict]:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content), path=request.url.path)
        return httpx.Response(status, content=sse_body(events))

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler),
                                     base_url="http://x") as c:
            spec = RequestSpec(model="m", output_len=5)
            return await send_request(c, spec, BenchPrompt(text="hi"), RequestRecord(0, 0), 0.0)
    return asyncio.run(go()), seen


def test_request_body_and_multi_token_chunks():
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5},
             "mtpserve": {"spec": {"num_draft_tokens": 3, "num_accepted_tokens": 2,
                                   "num_verify_steps": 1}}}
    rec, body = send_one([chunk("", None), chunk("a b", [1, 2, 3]), chunk("", [4]),
                          chunk("c", [5]), usage, "[DONE]"])
    assert body == {"path": "/v1/chat/completions", "model": "m", "stream": True,
                    "temperature": 0.0, "stream_options": {"include_usage": True},
                    "return_token_ids": True, "max_tokens": 5, "ignore_eos": True,
                    "messages": [{"role": "user", "content": "hi"}]}
    assert rec.ok and rec.chunk_tokens == [3, 1, 1] and rec.output_tokens == 5
    assert rec.prompt_tokens == 3 and rec.spec["num_accepted_tokens"] == 2


def test_chunks_without_token_ids_count_one_token_each():
    rec, _ = send_one([chunk(""), chunk("x"), chunk("yz"), "[DONE]"])
    assert rec.ok and rec.chunk_tokens == [1, 1] and rec.output_tokens == 2


@pytest.mark.parametrize("events, status, says", [
    ([{"error": {"message": "engine died"}}], 200, "error event: "),
    ([chunk("x", [1])], 200, "the stream ended without [DONE]"),
    (["not json"], 200, "a stream event that is not JSON"),
    ([], 404, "HTTP 404: "),
])
def test_failures_are_recorded_not_raised(events, status, says):
    rec, _ = send_one(events, status)
    assert not rec.ok and rec.error.startswith(says)


@pytest.mark.parametrize("concurrency, rate", [(3, None), (2, 500.0)])
def test_level_keeps_at_most_c_in_flight_and_cycles_prompts(concurrency, rate):
    state = {"now": 0, "max": 0, "prompts": []}

    async def handler(request: httpx.Request) -> httpx.Response:
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        state["prompts"].append(json.loads(request.content)["messages"][0]["content"])
        await asyncio.sleep(0.05)
        state["now"] -= 1
        return httpx.Response(200, content=sse_body([chunk("t", [7]), "[DONE]"]))

    prompts = [BenchPrompt(text=t) for t in ("p0", "p1", "p2")]
    plan = LoadPlan(num_prompts=8, request_rate=rate, seed=3, progress=False)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler),
                                     base_url="http://x") as c:
            return await run_level(c, RequestSpec(model="m"), prompts, concurrency, plan)
    records, wall = asyncio.run(go())
    assert state["max"] == concurrency
    assert [r.prompt_index for r in records] == [0, 1, 2, 0, 1, 2, 0, 1]
    assert sorted(state["prompts"]) == sorted(f"p{r.prompt_index}" for r in records)
    assert all(r.ok and r.output_tokens == 1 for r in records)
    if rate is not None:  # request i is not sent before the sum of its seeded arrival gaps
        rng = random.Random(3)
        arrivals = np.cumsum([0.0] + [rng.expovariate(rate) for _ in range(7)])
        assert all(r.start >= a - 1e-6 for r, a in zip(records, arrivals))


# --- against a running server (--url) -----------------------------------------------------

def test_url_run_counts_every_token_and_writes_json_and_png(url, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["bench", "--url", url, "--prompt-set", "repetitive", "--concurrency", "2,4",
                 "--num-prompts", "4", "--output-len", "8", "--output-dir", str(out), *QUIET])
    stdout = capsys.readouterr().out
    assert code == 0
    doc = load(out)
    assert set(doc) == {"schema", "meta", "config", "runs", "comparison"}
    assert doc["comparison"] is None and "api_key" not in doc["config"]
    assert {"date", "git", "host", "mtpserve_version"} <= set(doc["meta"])
    (run,) = doc["runs"]
    assert run["model"] == "SmolLM2-135M-Instruct.Q4_1" and run["server_flags"] is None
    assert [lv["concurrency"] for lv in run["levels"]] == [2, 4]
    for lv in run["levels"]:
        reqs, s = lv["requests"], lv["summary"]
        assert set(s) == SUMMARY_KEYS
        assert [r["prompt_index"] for r in reqs] == [0, 1, 2, 0]  # 3 prompts, cycled
        for r in reqs:
            assert r["error"] is None and r["finish_reason"] == "length"
            assert r["output_tokens"] == 8 and sum(r["chunk_tokens"]) == 8
            assert r["chunk_times"] == sorted(r["chunk_times"]) and r["chunk_times"][0] > 0
            assert r["latency"] >= r["chunk_times"][-1]
        assert max(t for r in reqs for t in r["chunk_tokens"]) > 1  # accepted drafts
        assert s["num_requests"] == 4 and s["num_errors"] == 0 and s["output_tokens"] == 32
        assert s["prompt_tokens"] == sum(r["prompt_tokens"] for r in reqs)
        spec = {k: sum(r["spec"][k] for r in reqs if r["spec"]) for k in
                ("num_draft_tokens", "num_accepted_tokens", "num_verify_steps")}
        assert spec["num_draft_tokens"] >= spec["num_accepted_tokens"] > 0
        assert s["acceptance_length"] == pytest.approx(
            (spec["num_accepted_tokens"] + spec["num_verify_steps"]) / spec["num_verify_steps"])
        # the /metrics deltas cover exactly the level's requests (warm-up excluded)
        assert {k: s["metrics_spec"][k] for k in spec} == spec
    png = (out / "results.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 1000
    rows = [line.split() for line in stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [(row[0], row[1], row[2], row[3]) for row in rows] == [("2", "4", "0", "32"),
                                                                  ("4", "4", "0", "32")]


def test_jsonl_dataset_is_sent_as_written(url, tmp_path):
    msgs = [{"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Name three colours."}]
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "Say hello."}) + "\n" + json.dumps({"messages": msgs})
                    + "\n")
    out = tmp_path / "out"
    assert main(["bench", "--url", url, "--dataset", str(path), "--concurrency", "1",
                 "--num-prompts", "2", "--output-len", "4", "--warmup", "0",
                 "--output-dir", str(out), *QUIET]) == 0
    doc = load(out)
    assert doc["config"]["dataset"] == str(path) and doc["config"]["prompt_set"] is None
    reqs = doc["runs"][0]["levels"][0]["requests"]
    expected = []
    for messages in ([{"role": "user", "content": "Say hello."}], msgs):
        r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "SmolLM2-135M-Instruct.Q4_1", "messages": messages, "max_tokens": 1})
        expected.append(r.json()["usage"]["prompt_tokens"])
    assert [r["prompt_tokens"] for r in reqs] == expected and expected[0] != expected[1]
    assert [r["output_tokens"] for r in reqs] == [4, 4]


def test_completions_endpoint_sends_the_raw_prompt(url, tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_text(json.dumps({"prompt": "The capital of France is"}) + "\n")
    out = tmp_path / "out"
    assert main(["bench", "--url", url + "/v1", "--dataset", str(path), "--endpoint",
                 "completions", "--concurrency", "1", "--num-prompts", "1", "--output-len", "4",
                 "--warmup", "0", "--output-dir", str(out), *QUIET]) == 0
    (req,) = load(out)["runs"][0]["levels"][0]["requests"]
    r = httpx.post(url + "/v1/completions", timeout=120, json={
        "model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "The capital of France is",
        "max_tokens": 1}).json()
    assert req["prompt_tokens"] == r["usage"]["prompt_tokens"]
    assert req["output_tokens"] == 4 and sum(req["chunk_tokens"]) == 4


def test_rounds_keep_both_servers_up_and_take_turns(url, monkeypatch):
    """Two plans against the one in-process server: both "started" before the first level,
    each level run 3 times per plan in the order off on, on off, off on; pooled and per-round
    summaries with exact counts; per-round ratios in the comparison."""
    import contextlib

    from mtpserve.bench import runner
    from mtpserve.bench.compare import compare_runs
    from mtpserve.bench.session import make_options

    events = []

    @contextlib.contextmanager
    def launcher(plan, opts):
        events.append(("start", plan.label))
        yield url
        events.append(("stop", plan.label))

    real = runner.run_level

    async def logged(client, spec, prompts, c, plan, label=""):
        events.append((label, c))
        return await real(client, spec, prompts, c, plan, label)

    monkeypatch.setattr(runner, "run_level", logged)
    plans = [runner.RunPlan("spec off", url=url), runner.RunPlan("spec on", url=url)]
    a = main_parser_args(["--prompt-set", "repetitive", "--concurrency", "1,2",
                          "--num-prompts", "2", "--output-len", "4", "--warmup", "0", *QUIET])
    off, on = runner.run_plans(plans, make_options(a), launcher, rounds=3)
    turns = ["spec off", "spec on", "spec on", "spec off", "spec off", "spec on"]
    assert events == [("start", "spec off"), ("start", "spec on"),
                      *[(label, c) for c in (1, 2) for label in turns],
                      ("stop", "spec on"), ("stop", "spec off")]
    for run in (off, on):
        for lv in run["levels"]:
            assert len(lv["rounds"]) == 3
            assert [r["output_tokens"] for r in lv["rounds"]] == [8, 8, 8]
            s = lv["summary"]
            assert s["num_requests"] == 6 and s["output_tokens"] == 24
            assert s["wall_s"] == pytest.approx(sum(r["wall_s"] for r in lv["rounds"]))
            assert [r["round"] for r in lv["requests"]] == [0, 0, 1, 1, 2, 2]
    rows = compare_runs(off, on)
    assert [len(row["round_ratios"]) for row in rows] == [3, 3]
    from mtpserve.bench.compare import ratio_interval
    assert rows[1]["round_interval"]["total_tok_s"] == ratio_interval(
        [r["total_tok_s"] for r in rows[1]["round_ratios"]])
    lv_off, lv_on = off["levels"][1], on["levels"][1]
    assert rows[1]["round_ratios"][2]["total_tok_s"] == pytest.approx(
        lv_on["rounds"][2]["total_tok_s"] / lv_off["rounds"][2]["total_tok_s"])
    assert rows[1]["ratio"]["total_tok_s"] == pytest.approx(
        lv_on["summary"]["total_tok_s"] / lv_off["summary"]["total_tok_s"])
    from mtpserve.bench.report import compare_table

    line = "  ".join(f"{r['total_tok_s']:.3f}x" for r in rows[1]["round_ratios"])
    text = compare_table(rows)
    assert "== on/off by round" in text and line in text


def main_parser_args(argv: list[str]):
    """``mtpserve bench ARGV`` parsed (no run)."""
    import argparse

    from mtpserve.bench.cli import add_bench_parser

    root = argparse.ArgumentParser()
    add_bench_parser(root.add_subparsers())
    return root.parse_args(["bench", *argv])


# --- self-started servers (subprocess) -----------------------------------------------------

def test_compare_starts_off_then_on_servers_and_prints_ratios(tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(["bench", "--compare", "--prompt-set", "repetitive", "--concurrency", "2",
                 "--num-prompts", "2", "--output-len", "8", "--warmup", "0",
                 "--output-dir", str(out), *QUIET, "--", "--speculative-algorithm", "ngram",
                 "--max-model-len", "256", "--kv-cache-memory", "0.125"])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    doc = load(out)
    off, on = doc["runs"]
    assert (off["label"], on["label"]) == ("spec off", "spec on")
    assert off["server_flags"] == ["--max-model-len", "256", "--kv-cache-memory", "0.125"]
    assert on["server_flags"] == ["--speculative-algorithm", "ngram", "--max-model-len", "256",
                                  "--kv-cache-memory", "0.125"]
    assert off["model_path"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    s_off, s_on = off["levels"][0]["summary"], on["levels"][0]["summary"]
    assert s_off["output_tokens"] == s_on["output_tokens"] == 16
    assert s_off["acceptance_length"] is None and s_off["metrics_spec"] is None
    assert s_on["acceptance_length"] is not None and s_on["acceptance_length"] >= 1.0
    assert s_on["metrics_spec"]["num_verify_steps"] == s_on["spec"]["num_verify_steps"]
    (row,) = doc["comparison"]
    assert row["concurrency"] == 2
    assert row["ratio"]["total_tok_s"] == pytest.approx(s_on["total_tok_s"] / s_off["total_tok_s"])
    assert row["ratio"]["tpot_p50"] == pytest.approx(
        s_on["tpot_ms"]["p50"] / s_off["tpot_ms"]["p50"])
    assert row["acceptance_length"] == s_on["acceptance_length"]
    assert "== speculation on vs off" in stdout and "on/off" in stdout
    assert (out / "server-spec-off.log").exists() and (out / "server-spec-on.log").exists()
    assert (out / "results.png").read_bytes().startswith(PNG_SIGNATURE)
    for run in doc["runs"]:  # both servers were stopped
        with pytest.raises(httpx.ConnectError):
            httpx.get(run["url"] + "/health", timeout=5)


def test_round_ratios_get_a_geometric_mean_and_a_t_interval():
    """Session 15's c=64 rounds (0.941, 0.932, 0.980): mean 0.951x, t interval (2 degrees of
    freedom, t = 4.303) 0.890-1.016: within noise; three rounds at 1.10, 1.12, 1.11: on
    faster; at 0.90, 0.91, 0.92: on slower; two rounds at 1.10 and 1.12 (t = 12.706): within
    noise; one round or a missing ratio: no interval."""
    import math
    import statistics

    from mtpserve.bench.compare import ratio_interval, verdict

    r = [0.941, 0.932, 0.980]
    logs = [math.log(x) for x in r]
    half = 4.303 * statistics.stdev(logs) / math.sqrt(3)
    mean, low, high = ratio_interval(r)
    assert mean == pytest.approx(math.exp(statistics.fmean(logs)), rel=1e-12)
    assert (low, high) == (pytest.approx(mean * math.exp(-half), rel=1e-12),
                           pytest.approx(mean * math.exp(half), rel=1e-12))
    assert (round(mean, 3), round(low, 3), round(high, 3)) == (0.951, 0.890, 1.016)
    assert verdict((mean, low, high)) == "within noise"
    assert verdict(ratio_interval([1.10, 1.12, 1.11])) == "on faster"
    assert verdict(ratio_interval([0.90, 0.91, 0.92])) == "on slower"
    assert verdict(ratio_interval([1.10, 1.12])) == "within noise"
    assert ratio_interval([0.9]) is None and ratio_interval([0.9, None]) is None
    assert ratio_interval([0.9, float("nan")]) is None and ratio_interval([1.0, math.inf]) is None
    assert verdict(None) == "-"
    # 12 rounds: t(11) = 2.201 (a review found 2.0 here, too narrow, flipping this verdict)
    twelve = [1.0094 * (1.015 if i % 2 else 1 / 1.015) for i in range(12)]
    mean, low, high = ratio_interval(twelve)
    logs = [math.log(x) for x in twelve]
    assert high / mean == pytest.approx(math.exp(2.201 * statistics.stdev(logs) / math.sqrt(12)),
                                        rel=1e-12)
    assert low < 1 and verdict((mean, low, high)) == "within noise"
    forty = [1.0, 1.02] * 20     # beyond 30 degrees of freedom: t(30) = 2.042
    m40, l40, h40 = ratio_interval(forty)
    assert h40 / m40 == pytest.approx(math.exp(
        2.042 * statistics.stdev([math.log(x) for x in forty]) / math.sqrt(40)), rel=1e-12)
