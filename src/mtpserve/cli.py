"""``mtpserve`` command line: serve | generate | wait-ready | bench | token-map."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from mtpserve.engine_args import add_engine_args, engine_config_from_args


def _serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 routes")
    p.add_argument("--log-level", default="info")
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=False,
                   help="run the engine loop in a process of its own (vLLM's EngineCore), so "
                        "that it does not share the GIL with the HTTP event loop")
    p.set_defaults(func=_serve)


def _generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="complete prompts offline and print the results")
    add_engine_args(p)
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts-file", help="one prompt per line")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--sampling-seed", type=int, help="per-request seed")
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    p.set_defaults(func=_generate)


def _wait_ready_parser(sub) -> None:
    p = sub.add_parser("wait-ready", help="wait until a server's /health says ready")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds")
    p.add_argument("--api-key")
    p.add_argument("--pid", type=int,
                   help="the server's process id: exit 2 as soon as it has ended (mtpserve "
                        "serve ends when its engine fails to start)")
    p.set_defaults(func=_wait_ready)


def _bench_parser(sub) -> None:
    from mtpserve.bench.cli import add_bench_parser

    add_bench_parser(sub)


def _token_map_parser(sub, describe: bool) -> None:
    description = None
    if describe:  # importing mtpserve.spec imports torch (~1 s): only for `mtpserve token-map`
        from mtpserve.spec.token_map_build import DESCRIPTION as description

    p = sub.add_parser("token-map", help="write a --speculative-token-map file (FR-Spec)",
                       description=description)
    p.add_argument("--model", help="HF directory or GGUF file (default: SmolLM2-135M-Instruct "
                                   "Q4_1 GGUF)")
    p.add_argument("--tokenizer", help="tokenizer path (default: the model's)")
    p.add_argument("--size", type=int, required=True, metavar="N",
                   help="ids in the map, 1..vocabulary size (the end-of-answer ids count among "
                        "them)")
    p.add_argument("--output", required=True, metavar="FILE",
                   help=".json (ascending list of ints) or .pt (1-D int64 tensor, SGLang's format)")
    p.add_argument("--corpus", action="extend", nargs="+", default=[], metavar="FILE",
                   help=".txt or .jsonl text like the traffic served (repeatable); without it the "
                        "map is the first N ids of the vocabulary")
    p.set_defaults(func=_token_map)


def _serve(a: argparse.Namespace) -> int:
    from mtpserve.server.api import run_server

    return run_server(engine_config_from_args(a), host=a.host, port=a.port, api_key=a.api_key,
                      log_level=a.log_level, engine_process=a.engine_process)


def _generate(a: argparse.Namespace) -> int:
    from mtpserve.llm import LLM
    from mtpserve.sampling_params import SamplingParams

    prompts = list(a.prompt)
    if a.prompts_file:
        with open(a.prompts_file, encoding="utf-8") as f:
            prompts += [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        print("mtpserve generate: give --prompt TEXT or --prompts-file FILE", file=sys.stderr)
        return 2
    llm = LLM.from_config(engine_config_from_args(a))
    params = SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p,
                            top_k=a.top_k, seed=a.sampling_seed)
    if a.chat:
        inputs = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                                    add_generation_prompt=True, tokenize=True,
                                                    return_dict=False) for p in prompts]
    else:
        inputs = prompts
    for prompt, res in zip(prompts, llm.generate(inputs, params)):
        out = res.outputs[0]
        if a.json:
            print(json.dumps({"prompt": prompt, "text": out.text, "token_ids": out.token_ids,
                              "finish_reason": out.finish_reason}))
        else:
            print(f"--- {prompt!r}\n{out.text}\n[{len(out.token_ids)} tokens, {out.finish_reason}]")
    return 0


def _wait_ready(a: argparse.Namespace) -> int:
    from mtpserve.server.wait_ready import wait_ready

    return wait_ready(a.url, a.timeout, api_key=a.api_key, pid=a.pid)


def _token_map(a: argparse.Namespace) -> int:
    from mtpserve.spec.token_map_build import make_token_map

    token_map = make_token_map(a.model, a.tokenizer, a.size, a.output, a.corpus)
    if not a.corpus:
        print("mtpserve token-map: no --corpus, so the map is the first ids of the vocabulary; "
              "a corpus like the traffic you serve gives a better map", file=sys.stderr)
    print(token_map.summary(a.output))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mtpserve`` console script; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="mtpserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _generate_parser(sub)
    _wait_ready_parser(sub)
    _bench_parser(sub)
    _token_map_parser(sub, describe="token-map" in argv)
    a = parser.parse_args(argv)
    logging.basicConfig(level=getattr(a, "log_level", "info").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore"):   # a line per request: wait-ready polls, bench
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return a.func(a)
    except (ValueError, OSError) as e:   # bad input, a missing or unwritable file
        print(f"mtpserve {a.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
