"""Host-to-device uploads of small int lists through one pinned ring buffer.

A speculative step uploads several short lists (token ids, positions, KV slots, block tables,
draft layouts). ``torch.tensor(values, pin_memory=True)`` takes a pinned block from the caching
host allocator for every one and records an event for it: on the H200 host here an upload so
cost ~45 us of host time (session 30, benchmarks/host_calls.py), seven of them ~0.3 ms of an
MTP step whose host work is its bound. Here the values are written into a slice of one pinned
buffer allocated once (through numpy's list conversion) and copied from there, asynchronously.

A slice must not be rewritten before its copy has run. The ring is cut in two halves; when the
writer leaves a half it records an event on every stream that copied from it, and before it
writes into a half again it waits for those events, recorded a whole half-ring of uploads
earlier (so in practice long done).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

RING_BYTES = 1 << 22        # 4 MiB: ~thousands of steps of uploads per half
_ALIGN = 16


class PinnedStaging:
    """One pinned ring buffer for uploads to ``device`` (module doc).

    Args:
        device: a CUDA device; nbytes: the ring's size (bytes); pin: allocate it pinned (False
        only in CPU tests of the ring's bookkeeping).
    """

    def __init__(self, device: torch.device, nbytes: int = RING_BYTES, pin: bool = True):
        self.device, self._pin = torch.device(device), pin
        self.half = max(_ALIGN, nbytes // 2 // _ALIGN * _ALIGN)   # both halves aligned
        self._buf = torch.empty(2 * self.half, dtype=torch.uint8, pin_memory=pin)
        self._np = self._buf.numpy()
        self._current, self._offset = 0, 0      # the half written, bytes used in it
        self._streams: set = set()              # streams that copied from the current half
        self._done: list[list] = [[], []]       # per half: events of its last copies
        self._lock = threading.Lock()
        self._views: dict[torch.dtype, torch.Tensor] = {}

    def upload(self, values, dtype: torch.dtype) -> torch.Tensor:
        """``values`` (a list or 1-D numpy array of ints) as a 1-D ``dtype`` tensor on the
        device, copied from the ring without blocking the host (more than half the ring, a
        dtype not in ``_NUMPY``, or during a CUDA graph capture: through a pinned block of its
        own, as before)."""
        out = self._from_ring(values, dtype,
                              lambda src: src.to(self.device, non_blocking=True))
        if out is None:
            out = torch.tensor(values, dtype=dtype, pin_memory=self._pin).to(
                self.device, non_blocking=True)
        return out

    def upload_into(self, dst: torch.Tensor, values) -> None:
        """Write ``values`` (a list of ints, ``len(dst)`` of them) into the contiguous 1-D
        device tensor ``dst`` with one copy from the ring, without blocking the host (the
        cases :meth:`upload` does not stage: through a pinned block of its own)."""
        if self._from_ring(values, dst.dtype, lambda src: dst.copy_(src, non_blocking=True)) \
                is None:
            dst.copy_(torch.tensor(values, dtype=dst.dtype, pin_memory=self._pin),
                      non_blocking=True)

    def _from_ring(self, values, dtype: torch.dtype, copy):
        """Write ``values`` into the ring and queue ``copy`` (a pinned 1-D ``dtype`` view of
        their slice -> any result) on the current stream, under the ring's lock so that a half
        switch sees it; return its result, or None where the ring cannot take them (see
        :meth:`upload`)."""
        np_dtype = _NUMPY.get(dtype)
        nbytes = len(values) * np_dtype.itemsize if np_dtype is not None else 0
        # a pinned block of its own; also while a CUDA graph is captured: a capture would keep
        # the ring slice's address while later uploads rewrite it (and a half switch syncs)
        if np_dtype is None or nbytes > self.half or torch.cuda.is_current_stream_capturing():
            return None
        with self._lock:
            if self._offset + nbytes > self.half:
                self._switch()
            start = self._current * self.half + self._offset
            self._offset += -(-nbytes // _ALIGN) * _ALIGN
            self._np[start:start + nbytes].view(np_dtype)[:] = values
            self._streams.add(torch.cuda.current_stream(self.device))
            size = np_dtype.itemsize   # one slice of a typed view: start is _ALIGN-aligned
            return copy(self._typed(dtype)[start // size:(start + nbytes) // size])

    def _typed(self, dtype: torch.dtype) -> torch.Tensor:
        """The whole ring as a 1-D ``dtype`` tensor (made once per dtype)."""
        view = self._views.get(dtype)
        if view is None:
            view = self._views[dtype] = self._buf.view(dtype)
        return view

    def _switch(self) -> None:
        """Leave the current half (an event on each stream that copied from it) for the other,
        once the copies from that one have run."""
        done = []
        for stream in self._streams:
            event = torch.cuda.Event()
            event.record(stream)
            done.append(event)
        self._done[self._current], self._streams = done, set()
        self._current = 1 - self._current
        for event in self._done[self._current]:
            event.synchronize()
        self._done[self._current], self._offset = [], 0


_NUMPY = {torch.int64: np.dtype(np.int64), torch.int32: np.dtype(np.int32),
          torch.float32: np.dtype(np.float32), torch.uint8: np.dtype(np.uint8)}


_staging: dict[torch.device, PinnedStaging] = {}


def staging_for(device: torch.device) -> PinnedStaging:
    """The process's ring for ``device`` (a CUDA device), made at first use."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    ring = _staging.get(device)
    if ring is None:
        ring = _staging[device] = PinnedStaging(device)
    return ring
