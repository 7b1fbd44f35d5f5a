"""The pinned upload ring (engine/pinned_staging.py): its bookkeeping on the CPU, with CUDA's
streams and events replaced by stand-ins that record what the ring asks of them."""

from __future__ import annotations

import torch

from mtpserve.engine import pinned_staging
from mtpserve.engine.pinned_staging import PinnedStaging


class FakeEvent:
    log: list = []

    def record(self, stream):
        self.stream = stream
        FakeEvent.log.append(("record", id(self), stream))

    def synchronize(self):
        FakeEvent.log.append(("synchronize", id(self), self.stream))


def _ring(monkeypatch, nbytes=128, capturing=False):
    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream-a")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
    return PinnedStaging("cpu", nbytes=nbytes, pin=False)


def test_uploads_fill_a_half_then_switch_after_its_copies(monkeypatch):
    ring = _ring(monkeypatch)          # two halves of 64 bytes
    a = ring.upload([1, 2, 3], torch.int64)          # 24 bytes, 32 with the alignment
    b = ring.upload([4, -5], torch.int32)            # 8 bytes, 16 aligned
    assert a.tolist() == [1, 2, 3] and a.dtype == torch.int64
    assert b.tolist() == [4, -5] and b.dtype == torch.int32
    assert (ring._current, ring._offset) == (0, 48)
    assert FakeEvent.log == []
    c = ring.upload([7, 8, 9], torch.int64)          # 48 + 24 > 64: into the second half
    assert c.tolist() == [7, 8, 9]
    assert ring._np[64:88].view("int64").tolist() == [7, 8, 9]
    assert (ring._current, ring._offset) == (1, 32)
    assert [(op, s) for op, _, s in FakeEvent.log] == [("record", "stream-a")]
    first_half_event = FakeEvent.log[0][1]
    ring.upload(list(range(5)), torch.int64)         # 32 + 40 > 64: back to the first half,
    log = [(op, e) for op, e, _ in FakeEvent.log]    # once the first half's copies have run
    assert log[1][0] == "record" and log[2] == ("synchronize", first_half_event)
    assert ring._np[0:40].view("int64").tolist() == [0, 1, 2, 3, 4]
    assert (ring._current, ring._offset) == (0, 48)


def test_larger_than_half_and_other_dtypes_go_around_the_ring(monkeypatch):
    ring = _ring(monkeypatch)
    big = ring.upload(list(range(9)), torch.int64)   # 72 bytes > 64
    assert big.tolist() == list(range(9))
    half = ring.upload([1, 0], torch.bool)
    assert half.tolist() == [True, False]
    assert (ring._current, ring._offset) == (0, 0) and FakeEvent.log == []


def test_no_ring_slice_while_a_graph_is_captured(monkeypatch):
    ring = _ring(monkeypatch, capturing=True)
    assert ring.upload([4, 5], torch.int64).tolist() == [4, 5]
    assert (ring._current, ring._offset) == (0, 0) and ring._streams == set()


def test_halves_stay_aligned_for_any_size(monkeypatch):
    ring = _ring(monkeypatch, nbytes=100)               # halves of 48 bytes, not 50
    assert ring.half == 48
    ring.upload([1] * 5, torch.int64)                   # 40 bytes
    assert ring.upload([2, 3], torch.int64).tolist() == [2, 3]   # second half, offset 48
    assert (ring._current, ring._offset) == (1, 16)


def test_one_ring_per_device(monkeypatch):
    made = []
    monkeypatch.setattr(pinned_staging, "PinnedStaging", lambda d: made.append(d) or d)
    monkeypatch.setattr(pinned_staging, "_staging", {})
    assert pinned_staging.staging_for("cuda:1") == torch.device("cuda:1")
    pinned_staging.staging_for(torch.device("cuda", 1))
    assert made == [torch.device("cuda:1")]


def test_upload_into_writes_the_destination_through_the_ring(monkeypatch):
    ring = _ring(monkeypatch)
    dst = torch.full((3,), -1, dtype=torch.int64)
    ring.upload_into(dst, [5, 6, 7])
    assert dst.tolist() == [5, 6, 7]
    assert ring._np[0:24].view("int64").tolist() == [5, 6, 7]
    assert (ring._current, ring._offset) == (0, 32) and ring._streams == {"stream-a"}
    big = torch.zeros(9, dtype=torch.int64)          # 72 bytes > a half: a block of its own
    ring.upload_into(big, list(range(9)))
    assert big.tolist() == list(range(9)) and (ring._current, ring._offset) == (0, 32)


def test_a_numpy_array_uploads_as_a_list_does(monkeypatch):
    import numpy as np

    ring = _ring(monkeypatch)
    a = ring.upload(np.array([5, -6, 7], np.int64), torch.int32)
    assert a.tolist() == [5, -6, 7] and a.dtype == torch.int32
    assert ring._np[0:12].view("int32").tolist() == [5, -6, 7]
