"""What a CUDA graph's static inputs hold, so that a step writes only the inputs that changed.

A captured graph reads its inputs from static device tensors that keep their values between
replays: only the steps that replay it write them. Several inputs of a decode or verify step of
the same sequences stay the same from step to step (the recurrent-state slots, the scratch rows,
the block table until a sequence takes a new block, the padding layout of a full block). Each
write costs the host a torch call (~10-15 us on the H200 host, session 30's
benchmarks/host_calls.py) on the path from a step's read-back to the next replay, where the
device may be idle waiting for it. :class:`WrittenInputs` remembers the host values last written
into each input of each graph; a step compares and skips the copy when they are equal.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


class WrittenInputs:
    """Host values last written into static graph inputs, by (graph key, input name).

    A value is any sequence of ints (or a str): :meth:`stale` keeps its own list copy, so the
    caller may reuse or mutate what it passed. Whoever writes a static input outside
    :meth:`stale` (a scatter whose values the host does not keep) calls :meth:`forget` for it.
    """

    def __init__(self):
        self._values: dict[tuple[Hashable, str], list | str] = {}

    def stale(self, key: Hashable, name: str, value: Sequence[int] | str) -> bool:
        """Whether input ``name`` of graph ``key`` must be written to hold ``value``: True (and
        ``value`` recorded as written) unless the last value recorded there equals it. The
        caller writes it when True."""
        value = value if isinstance(value, str) else list(value)
        if self._values.get((key, name)) == value:
            return False
        self._values[(key, name)] = value
        return True

    def forget(self, key: Hashable, *names: str) -> None:
        """Input(s) ``names`` of graph ``key`` now hold values not recorded here."""
        for name in names:
            self._values.pop((key, name), None)


def write_tables(written: WrittenInputs, key: Hashable, tables: torch.Tensor, batch) -> None:
    """The block tables of ``batch`` (a ForwardBatch) into graph ``key``'s static ``tables``
    [rows, max_blocks] int32, unless they hold them already (``batch.block_tables_cpu`` known
    and equal to what was written last). Columns past the step's width and rows past its
    sequences keep what they held: nothing reads them."""
    B, width = batch.block_tables.shape
    host = batch.block_tables_cpu
    if host is None:
        written.forget(key, "tables")
    elif not written.stale(key, "tables", [B, width] + host):
        return
    tables[:B, :width].copy_(batch.block_tables)
