"""Where the time to first token goes at concurrency 1, on the CPU, beyond the prefill forward.

Serves the real app and engine (a tiny random `tiny-llama` checkpoint, written once to a temp
directory or ``--checkpoint``) in a subprocess whose hand-offs are timestamped by monkeypatching
(nothing under src/ changes): uvicorn calling the app, the two /v1 dependencies, the body, the
handler, tokenization, the response start, the engine request's submission and pick-up,
add_request, each step's prepare / execute / sample, the delivery to the event loop, rendering
and the ASGI write of the first token. A raw-socket HTTP/1.1 client (no HTTP library, first token
found by a byte search) sends ``--requests`` streamed completions one after another; the table
gives each milestone's median time since the client's send (time.perf_counter is
CLOCK_MONOTONIC, shared by both processes), then the delta from the milestone before.

    python benchmarks/cpu_ttft.py [--prompt-words 128] [--requests 60] [--endpoint chat]
    python benchmarks/cpu_ttft.py --async-scheduling     # the GPU's default pipeline, on the CPU
    python benchmarks/cpu_ttft.py --bench-client         # + the bench's httpx client, paired

Set OMP_NUM_THREADS=1 on a small shared machine (the forward then varies less).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import re
import socket
import statistics
import sys
import tempfile
import time

MILESTONES = [   # (event, condition on its fields), each the first one after the one before
    ("asgi.call", None), ("handler", None), ("tokenize.end", None),
    ("response.start", None), ("submit", None), ("engine.pickup", None),
    ("add_request.end", None), ("prepare.start", None), ("execute.start", None),
    ("execute.end", None), ("sample.end", None), ("step.end", lambda k: k.get("tok", 0) > 0),
    ("event_loop.wakes", None), ("render.end", None), ("asgi.send", lambda k: k.get("tok")),
]


def serve(port: int, ckpt: str, async_scheduling: bool) -> None:
    """The instrumented server (a subprocess); GET /_events returns and clears the events."""
    import uvicorn

    from mtpserve.config import EngineConfig
    from mtpserve.engine import async_engine, engine, model_runner, sampler
    from mtpserve.server import api, serving_chat, serving_completion

    events: list = []

    def ev(name: str, **kw) -> None:
        events.append((time.perf_counter(), name, kw))

    def around(obj, attr: str, before: str | None, after: str | None, info=None) -> None:
        f = getattr(obj, attr)

        @functools.wraps(f)
        def w(*a, **k):
            if before:
                ev(before)
            r = f(*a, **k)
            if after:
                ev(after, **(info(r) if info else {}))
            return r
        setattr(obj, attr, w)

    around(serving_completion, "prompt_token_ids", None, "tokenize.end")
    around(serving_chat, "chat_prompt_ids", None, "tokenize.end")
    around(async_engine.AsyncEngine, "_submit", "submit", None)
    around(async_engine.AsyncEngine, "_handle", "engine.pickup", None)
    around(async_engine, "_put_all", "event_loop.wakes", None)
    around(engine.LLMEngine, "add_request", None, "add_request.end")
    around(engine.LLMEngine, "step", None, "step.end",
           lambda outs: {"tok": sum(len(o.new_token_ids) for o in outs)})
    around(model_runner.ModelRunner, "prepare", "prepare.start", None)
    around(model_runner.ModelRunner, "execute", "execute.start", "execute.end")
    around(sampler.Sampler, "sample", None, "sample.end")
    for cls in (serving_completion._CompletionFormat, serving_chat._ChatFormat):
        around(cls, "render", None, "render.end")
    for cls in (serving_completion.CompletionServing, serving_chat.ChatServing):
        create = cls.create

        async def timed(self, *a, _create=create, **k):
            ev("handler")
            return await _create(self, *a, **k)
        cls.create = timed

    cfg = EngineConfig(model=ckpt, device="cpu", dtype="float32", max_model_len=1024,
                       async_scheduling=async_scheduling)
    eng = api.make_engine(cfg)
    app = api.build_app(eng)

    @app.get("/_events")
    async def take() -> list:
        out = list(events)
        events.clear()
        return out

    async def outer(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            ev("asgi.call")

            async def timed_send(m):
                body = m.get("body", b"")
                if m["type"] == "http.response.start":
                    ev("response.start")
                elif re.search(rb'"token_ids":\[\d', body):
                    ev("asgi.send", tok=True)
                await send(m)
            return await app(scope, receive, timed_send)
        return await app(scope, receive, send)

    uvicorn.run(outer, host="127.0.0.1", port=port, log_level="warning")


class RawClient:
    """HTTP/1.1 over one kept-alive socket, no library."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get_json(self, path: str):
        self.sock.sendall(b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path.encode())
        buf = b""
        while True:
            buf += self.sock.recv(1 << 20)
            head, _, body = buf.partition(b"\r\n\r\n")
            m = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
            if m and len(body) >= int(m.group(1)):
                return json.loads(body[:int(m.group(1))])

    def stream(self, path: str, body: dict) -> float:
        """Seconds from the send to the first chunk carrying a token id (reads to the end)."""
        data = json.dumps(body).encode()
        msg = (b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
               b"content-length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
        t0 = time.perf_counter()
        self.sock.sendall(msg)
        buf, first = b"", None
        while not buf.endswith(b"0\r\n\r\n"):
            got = self.sock.recv(65536)
            buf += got
            if not got or not buf.startswith(b"HTTP/1.1 200"[:len(buf)]):
                raise SystemExit(f"bad response: {buf[:300]!r}")
            if first is None and re.search(rb'"token_ids":\[\d', buf):
                first = time.perf_counter() - t0
        return first


def timeline(events: list, t0: float) -> dict[str, float]:
    row, last = {}, 0.0
    for name, cond in MILESTONES:
        for t, nm, kw in events:
            if nm == name and t - t0 >= last and (cond is None or cond(kw)):
                row[name] = last = t - t0
                break
    return row


def prompts(words: int, n: int, vocab: int = 49152) -> list[str]:
    rng = random.Random(0)
    return [" ".join(f"w{rng.randrange(2, vocab)}" for _ in range(words)) for _ in range(n)]


def body_for(endpoint: str, text: str) -> dict:
    b = {"stream": True, "temperature": 0.0, "max_tokens": 8, "ignore_eos": True,
         "return_token_ids": True, "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        b["messages"] = [{"role": "user", "content": text}]
    else:
        b["prompt"] = text
    return b


def run(a, port: int) -> None:
    path = "/v1/chat/completions" if a.endpoint == "chat" else "/v1/completions"
    texts = prompts(a.prompt_words, 64)
    c = RawClient(port)
    rows = []
    for i in range(a.requests + 3):
        c.get_json("/_events")
        t0 = time.perf_counter()
        ttft = c.stream(path, body_for(a.endpoint, texts[i % len(texts)]))
        row = timeline(c.get_json("/_events"), t0)
        row["client.first_token"] = ttft
        if i >= 3:
            rows.append(row)
    print(f"{a.endpoint}, {a.prompt_words}-word prompts, {a.requests} requests, async scheduling "
          f"{a.async_scheduling}: median ms since the client's send")
    prev = 0.0
    for name in [m[0] for m in MILESTONES] + ["client.first_token"]:
        vals = [r[name] for r in rows if name in r]
        if vals:
            m = statistics.median(vals) * 1e3
            print(f"  {name:20s} {m:8.3f}  (+{m - prev:6.3f})")
            prev = m
    if a.bench_client:
        asyncio.run(paired_bench_client(a, port, path, texts, c))


async def paired_bench_client(a, port: int, path: str, texts: list[str], raw: RawClient) -> None:
    """The bench's own client (httpx, mtpserve.bench.client) and the raw one in turns."""
    import httpx

    from mtpserve.bench.client import RequestRecord, RequestSpec, send_request
    from mtpserve.bench.dataset import BenchPrompt

    raws, bench = [], []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as h:
        model = (await h.get("/v1/models")).json()["data"][0]["id"]
        spec = RequestSpec(model=model, endpoint=a.endpoint, output_len=8)
        for i in range(a.requests + 3):
            text = texts[i % len(texts)]
            for which in ((0, 1) if i % 2 else (1, 0)):
                if which == 0:
                    t = raw.stream(path, body_for(a.endpoint, text))
                else:
                    rec = await send_request(h, spec, BenchPrompt(text=text),
                                             RequestRecord(i, 0), time.perf_counter())
                    t = rec.ttft
                if i >= 3:
                    (raws if which == 0 else bench).append(t)
    d = [b - r for r, b in zip(raws, bench)]
    print(f"  bench client (httpx) TTFT p50 {statistics.median(bench) * 1e3:.2f} ms against raw "
          f"{statistics.median(raws) * 1e3:.2f} ms; paired median {statistics.median(d) * 1e3:+.2f}"
          f" ms")


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} "
                 "<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> assistant "
                 "{% endif %}")


def make_checkpoint(path: str) -> None:
    """tiny-llama with random weights and the word tokenizer, plus a chat template (words)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_ready import write_checkpoint

    write_checkpoint("tiny-llama", path)
    cfg_path = os.path.join(path, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["chat_template"] = CHAT_TEMPLATE
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    ap.add_argument("--prompt-words", type=int, default=128, help="one token each")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--checkpoint", help="tiny-llama checkpoint dir (written when missing)")
    ap.add_argument("--async-scheduling", action="store_true")
    ap.add_argument("--bench-client", action="store_true")
    ap.add_argument("--serve-port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    ckpt = a.checkpoint or os.path.join(tempfile.gettempdir(), "mtpserve-cpu-ttft-tiny-llama")
    if a.serve_port:
        serve(a.serve_port, ckpt, a.async_scheduling)
        return
    if not os.path.isfile(os.path.join(ckpt, "model.safetensors")):
        make_checkpoint(ckpt)
    import signal

    from mtpserve.bench.server_proc import ServerProcess

    def command(port: int) -> list[str]:
        return ([sys.executable, __file__, "--serve-port", str(port), "--checkpoint", ckpt]
                + ["--async-scheduling"] * a.async_scheduling)

    with ServerProcess([], command=command, stop_signal=signal.SIGINT,
                       ready_timeout_s=180) as server:
        run(a, server.port)


if __name__ == "__main__":
    main()
