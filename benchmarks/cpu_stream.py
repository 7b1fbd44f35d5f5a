"""What the HTTP side of the server costs per streamed token, without a model.

At 64 concurrent streams on the H200 the server's time per output token was ~25% above the
engine's own step time (BENCHMARKS.md, session 14): the engine thread and the event loop share
one GIL, and the event loop's work per chunk (fan-out queues, folding the delta, JSON, SSE, ASGI
sends) grows with the streams. This runs the real app and engine loop over a fake engine whose
step releases the GIL for ``--step-ms`` (as a GPU step does) and returns one token for every
running request, serves it with uvicorn in a subprocess, drives ``--concurrency`` streaming
completions from this process, and reports the server process's CPU time per streamed token
(user + system, from /proc: robust to other load on the machine) and the steps it ran per second.

    python benchmarks/cpu_stream.py [--concurrency 64] [--tokens 128] [--step-ms 4]
    python benchmarks/cpu_stream.py --http h11 --loop asyncio   # uvicorn's pure-Python pair
    python benchmarks/cpu_stream.py --cprofile FILE   # the server's event loop, by function
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import httpx

from mtpserve.outputs import RequestOutput


class FakeEngine:
    """An ``LLMEngine`` stand-in: each ``step`` sleeps ``step_s`` (GIL released, like waiting
    for the GPU) and gives every running request one token ``" w"`` until its max_tokens."""

    def __init__(self, step_s: float):
        from types import SimpleNamespace

        from mtpserve.bench.random_model import word_tokenizer
        from mtpserve.config import EngineConfig

        self.step_s = step_s
        self.tokenizer = word_tokenizer(1000)
        self.config = EngineConfig(served_model_name="fake")
        self.max_model_len = 4096
        self.model_config = SimpleNamespace(vocab_size=1000)
        self.running: dict[str, list] = {}   # request id -> [max_tokens, tokens so far, prompt]
        self.steps = 0

    def warmup(self) -> None:
        pass

    def add_request(self, rid, prompt, params) -> None:
        self.running[rid] = [params.max_tokens, 0, len(prompt)]

    def abort_request(self, rid) -> None:
        self.running.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def stats(self) -> dict:
        return {"num_running": len(self.running), "num_waiting": 0, "kv_cache_usage": 0.0}

    def step(self) -> list[RequestOutput]:
        time.sleep(self.step_s)
        self.steps += 1
        outs = []
        for rid, r in list(self.running.items()):
            r[1] += 1
            done = r[1] >= r[0]
            outs.append(RequestOutput(rid, [5], " w", None, done, "length" if done else None,
                                      num_prompt_tokens=r[2], num_output_tokens=r[1]))
            if done:
                del self.running[rid]
        return outs


def serve(port: int, step_ms: float, cprofile: str | None, http: str, loop: str) -> None:
    """The server side (a subprocess): the real app over the fake engine on ``port``."""
    import uvicorn

    from mtpserve.engine.async_engine import AsyncEngine
    from mtpserve.server.api import build_app

    fake = FakeEngine(step_ms / 1e3)
    engine = AsyncEngine(lambda: fake, warmup=False)
    app = build_app(engine, served_model_name="fake")

    @app.get("/steps")
    async def steps() -> dict:
        return {"steps": fake.steps}

    prof = None
    if cprofile:   # the event loop's thread (uvicorn runs it in this one)
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    try:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", http=http, loop=loop)
    finally:
        if prof is not None:
            import pstats

            prof.disable()
            with open(cprofile, "w") as f:
                st = pstats.Stats(prof, stream=f)
                st.sort_stats("tottime").print_stats(45)
                st.sort_stats("cumulative").print_stats(45)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _drive(url: str, concurrency: int, tokens: int) -> int:
    """``concurrency`` streaming completions of ``tokens`` tokens at once; tokens received."""
    body = {"model": "fake", "prompt": "w2 w3 w4", "max_tokens": tokens, "stream": True}
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        async def one() -> int:
            got = 0
            async with client.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        got += json.loads(line[6:])["choices"][0]["text"].count("w")
            return got
        return sum(await asyncio.gather(*[one() for _ in range(concurrency)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--step-ms", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cprofile", help="profile the server's event loop into this file")
    ap.add_argument("--http", default="auto", help="uvicorn's HTTP implementation (h11, "
                    "httptools; auto: httptools when installed)")
    ap.add_argument("--loop", default="auto", help="uvicorn's event loop (asyncio, uvloop)")
    ap.add_argument("--serve-port", type=int, help=argparse.SUPPRESS)   # the server subprocess
    a = ap.parse_args()
    if a.serve_port:
        serve(a.serve_port, a.step_ms, a.cprofile, a.http, a.loop)
        return
    import signal

    from mtpserve.bench.server_proc import ServerProcess

    def command(port: int) -> list[str]:
        return ([sys.executable, __file__, "--serve-port", str(port), "--step-ms", str(a.step_ms),
                 "--http", a.http, "--loop", a.loop]
                + (["--cprofile", a.cprofile] if a.cprofile else []))

    with ServerProcess([], command=command, stop_signal=signal.SIGINT,
                       ready_timeout_s=60) as server:
        url, pid = server.url, server.proc.pid
        asyncio.run(_drive(url, 2, 4))   # first requests: imports, JIT of the paths
        for r in range(a.rounds):
            cpu0, steps0, t0 = _cpu_seconds(pid), httpx.get(url + "/steps").json()["steps"], \
                time.perf_counter()
            got = asyncio.run(_drive(url, a.concurrency, a.tokens))
            wall = time.perf_counter() - t0
            cpu = _cpu_seconds(pid) - cpu0
            steps = httpx.get(url + "/steps").json()["steps"] - steps0
            print(json.dumps(dict(round=r, tokens=got, wall_s=round(wall, 3),
                                  server_cpu_us_per_token=round(cpu / got * 1e6, 1),
                                  steps_per_s=round(steps / wall, 1),
                                  ideal_steps_per_s=round(1e3 / a.step_ms, 1))), flush=True)


if __name__ == "__main__":
    main()
