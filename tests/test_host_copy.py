"""engine/forward_batch.py's ``HostCopy``: the pinned buffers it reads back through come from a
pool by (shape, dtype) and go back once read; on the CPU the tensor itself is read."""

from __future__ import annotations

import pytest
import torch

from mtpserve.engine import forward_batch
from mtpserve.engine.forward_batch import HostCopy, _pinned_give, _pinned_take


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setattr(forward_batch, "_PINNED_POOL", {})
    return forward_batch._PINNED_POOL


def test_a_buffer_given_back_is_taken_again_for_its_shape_and_dtype_only(pool):
    buf = torch.zeros(2, 3, dtype=torch.int64)
    _pinned_give(buf)
    assert _pinned_take(torch.Size([2, 3]), torch.int64) is buf
    assert pool[((2, 3), torch.int64)] == []
    _pinned_give(buf)
    if torch.cuda.is_available():    # another dtype: a new pinned block
        assert _pinned_take(torch.Size([2, 3]), torch.int32).dtype == torch.int32
    else:                            # (which a CPU build of torch cannot pin)
        with pytest.raises(RuntimeError):
            _pinned_take(torch.Size([2, 3]), torch.int32)
    assert _pinned_take(torch.Size([2, 3]), torch.int64) is buf


def test_the_pool_keeps_at_most_its_depth(pool):
    for _ in range(forward_batch._POOL_DEPTH + 3):
        _pinned_give(torch.zeros(4))
    assert len(pool[((4,), torch.float32)]) == forward_batch._POOL_DEPTH


def test_on_the_cpu_the_tensor_is_read_once(pool):
    x = torch.tensor([[1, 2], [3, 4]])
    copy = HostCopy(x)
    first = copy.tolist()
    x.fill_(0)
    assert first == [[1, 2], [3, 4]] and copy.tolist() is first and pool == {}
