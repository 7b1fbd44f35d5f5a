"""The ``mtpserve serve`` flags a benchmark passes to the servers it starts.

The flags are checked with the serve command's own parser before any server starts, and
``--compare`` derives its speculation-off server by dropping every ``--speculative-*`` flag
(with its value, if that flag takes one) and ``--no-speculative-*`` switch.
"""

from __future__ import annotations

import argparse

# bench picks the address itself (a free port on 127.0.0.1)
RESERVED = ("--host", "--port")


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D401 - argparse hook
        raise ValueError(f"server flags: {message}")


def _serve_parser() -> argparse.ArgumentParser:
    from mtpserve.cli import _serve_parser as add_serve

    root = _RaisingParser(prog="mtpserve", add_help=False)
    sub = root.add_subparsers(dest="command")
    add_serve(sub)
    return sub.choices["serve"]


def parse_serve_flags(flags: list[str]) -> argparse.Namespace:
    """Parse ``flags`` as ``mtpserve serve`` would.

    Raises:
        ValueError: an unknown flag, a bad value, or ``--host`` / ``--port`` (bench chooses them).
    """
    for flag in flags:
        if flag.split("=", 1)[0] in RESERVED:
            raise ValueError(f"server flags: leave out {flag.split('=', 1)[0]}; the benchmark "
                             "starts its server on a free port of 127.0.0.1")
    return _serve_parser().parse_args(flags)


def _spec_flag_arity() -> dict[str, int]:
    """Option string -> number of values, for every speculative flag of ``serve``."""
    arity = {}
    for action in _serve_parser()._actions:
        for opt in action.option_strings:
            if opt.startswith(("--speculative-", "--no-speculative-")):
                arity[opt] = 0 if action.nargs == 0 else 1
    return arity


def is_spec_flag(flag: str) -> bool:
    return flag.split("=", 1)[0].startswith(("--speculative-", "--no-speculative-"))


def has_spec_flags(flags: list[str]) -> bool:
    """Whether ``flags`` turn on speculation (name a ``--speculative-algorithm``)."""
    return parse_serve_flags(flags).speculative_algorithm is not None


def strip_spec_flags(flags: list[str]) -> list[str]:
    """``flags`` without every speculative flag and its value (``--flag v`` or ``--flag=v``)."""
    arity = _spec_flag_arity()
    out, skip = [], 0
    for flag in flags:
        if skip:
            skip -= 1
        elif is_spec_flag(flag):
            skip = 0 if "=" in flag else arity.get(flag, 1)
        else:
            out.append(flag)
    return out
