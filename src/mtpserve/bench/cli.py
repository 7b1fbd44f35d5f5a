"""``mtpserve bench``: serving benchmark against a running server or one it starts.

    mtpserve bench --url http://127.0.0.1:8000 --concurrency 1,4,16
    mtpserve bench [--model PATH] [bench flags] -- [mtpserve serve flags]
    mtpserve bench --compare --prompt-set code-edit -- --speculative-algorithm ngram

Exit codes: 0 done; 1 the server could not be reached / started / used, or requests failed;
2 bad flags or prompt file; 130 interrupted (SIGINT); 143 terminated (SIGTERM). Interrupted or
terminated, the benchmark stops the servers it started before it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading

from mtpserve.bench.prompts import PROMPT_SETS

USAGE_EPILOG = ("Without --url the benchmark starts `mtpserve serve` itself (the default model "
                "unless --model); flags after `--` go to that server. --compare runs the load "
                "against the server without its --speculative-* flags, then with them.")


def concurrency_list(text: str) -> tuple[int, ...]:
    """``"1,4,16"`` -> ``(1, 4, 16)``; raises ``argparse.ArgumentTypeError`` unless every item
    is an integer >= 1."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 1,4,16, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"every concurrency must be >= 1, got {text!r}")
    return values


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return v
    return parse


def add_bench_parser(sub) -> None:
    """Register the ``bench`` subcommand on ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser("bench", help="serving benchmark (tok/s, TTFT, ITL, acceptance length)",
                       description=__doc__, epilog=USAGE_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", help="benchmark this running server instead of starting one")
    where.add_argument("--model", help="model of the server to start (default: SmolLM2-135M)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt-set", default="chat", choices=list(PROMPT_SETS))
    src.add_argument("--dataset", metavar="FILE.jsonl",
                     help='one JSON object a line with "prompt" or "messages"')
    p.add_argument("--num-prompts", type=_positive(int), default=64, help="requests per level")
    p.add_argument("--concurrency", type=concurrency_list, default=(1, 4, 16),
                   help="requests in flight, one level each (default 1,4,16)")
    p.add_argument("--request-rate", type=_positive(float), metavar="R",
                   help="Poisson arrivals at R requests/s (still capped at the concurrency)")
    p.add_argument("--output-len", type=_positive(int), metavar="N",
                   help="exactly N output tokens per request (ignore_eos)")
    p.add_argument("--max-tokens", type=_positive(int), default=256,
                   help="cap without --output-len (the model may stop earlier)")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=1, help="unmeasured requests first, per server")
    p.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrivals")
    p.add_argument("--compare", action="store_true",
                   help="run without, then with the --speculative-* server flags; print ratios")
    p.add_argument("--rounds", type=_positive(int), default=1, metavar="R",
                   help="with --compare: both servers up at once (each with half the "
                        "--gpu-memory-utilization), each level R times per server in turns "
                        "(A B, B A, ...); pooled and per-round numbers")
    p.add_argument("--output-dir", help="write results.json and results.png here")
    p.add_argument("--api-key", help="bearer key for the server")
    p.add_argument("--model-name", help="model id in requests (default: from /v1/models)")
    p.add_argument("--ready-timeout", type=_positive(float), default=600.0, metavar="S",
                   help="seconds to wait for a server to be ready")
    p.add_argument("--request-timeout", type=_positive(float), default=600.0, metavar="S")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--log-level", default="warning")
    p.add_argument("server_args", nargs="*", metavar="-- SERVER_FLAGS",
                   help="flags for the started `mtpserve serve`")
    p.set_defaults(func=run_bench)


class Terminated(Exception):
    """SIGTERM reached the benchmark (raised in the main thread, so that the servers it started
    are stopped on the way out)."""


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def _sigterm_raises():
    """While inside, SIGTERM raises :class:`Terminated` in the main thread (CI cancellation,
    ``kill``, ``timeout`` and batch schedulers send SIGTERM; Python's default would end the
    process at once and leave the started servers running). No-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_bench(a: argparse.Namespace, launcher=None) -> int:
    """Run ``mtpserve bench``; returns the exit code (see the module docstring).

    Raises:
        ValueError, FileNotFoundError: bad flags or prompt file (the CLI maps them to exit 2).
    """
    from mtpserve.bench import session
    from mtpserve.bench.errors import BenchError

    plans, opts = session.plan_from_args(a)
    try:
        with _sigterm_raises():
            return session.run_session(a, plans, opts, launcher)
    except BenchError as e:
        print(f"mtpserve bench: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mtpserve bench: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("mtpserve bench: terminated", file=sys.stderr)
        return 143
