"""The benchmark's own failure: a server that cannot be reached, started or used."""

from __future__ import annotations


class BenchError(RuntimeError):
    """A benchmark that cannot go on; ``mtpserve bench`` prints the message and exits 1."""
