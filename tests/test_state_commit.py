"""Rolling recurrent state back after a verify step: on the host (``StateCache.commit``, one
sequence) and on the device from the device's accepted counts (``commit_rows``, every verified
sequence at once, spec/draft_ahead.py ``commit_ahead``), and when the host still commits."""

from __future__ import annotations

import pytest
import torch

from mtpserve.engine.state_cache import LinearAttnShape, StateCache
from mtpserve.spec.draft_ahead import AheadStep


def _cache(dtype: torch.dtype = torch.float32) -> StateCache:
    """Conv states in ``dtype``, SSM states in float32."""
    shape = LinearAttnShape(conv_dim=3, kernel=3, num_v_heads=2, head_k_dim=2, head_v_dim=2)
    cache = StateCache(2, shape, 4, dtype, torch.float32, torch.device("cpu"),
                       max_drafts=3, scratch_rows=2)
    # scratch row r, position p of layer l holds 100 l + 10 r + p everywhere
    for t in (cache._conv_scratch, cache._ssm_scratch):
        L, R, P = t.shape[:3]
        vals = (100 * torch.arange(L).view(L, 1, 1) + 10 * torch.arange(R).view(1, R, 1)
                + torch.arange(P).view(1, 1, P)).float()
        t.copy_(vals.view(L, R, P, *([1] * (t.dim() - 3))).expand_as(t))
    return cache


def test_commit_rows_equals_one_commit_per_sequence():
    rows_cache, host_cache = _cache(), _cache()
    slots, rows, accepted = [3, 1], [0, 1], [2, 0]
    rows_cache.commit_rows(torch.tensor(slots), torch.tensor(rows), torch.tensor(accepted))
    for slot, row, a in zip(slots, rows, accepted):
        host_cache.commit(slot, row, a)
    assert torch.equal(rows_cache._conv, host_cache._conv)
    assert torch.equal(rows_cache._ssm, host_cache._ssm)
    # layer 1, slot 3: scratch row 0 after query token 2; slot 1: row 1 after token 0
    assert rows_cache._ssm[1, 3].unique().tolist() == [102.0]
    assert rows_cache._conv[0, 1].unique().tolist() == [10.0]
    assert rows_cache._ssm[:, [0, 2, 4]].abs().sum().item() == 0   # other slots untouched


class _Seq:
    def __init__(self, rid):
        self.request_id = rid


def test_the_host_commits_where_its_count_differs_from_the_device():
    ahead = AheadStep(torch.tensor([5, 6, 7, 8]), torch.tensor([1, 3]), [_Seq("a"), _Seq("b")],
                      [10, 20])
    assert not ahead.committed_as("a", 1)            # nothing committed on the device yet
    ahead.committed = True
    assert ahead.committed_as("a", 1) and ahead.committed_as("b", 3)
    assert not ahead.committed_as("a", 0)            # the host stopped it earlier
    assert not ahead.committed_as("c", 1)            # not in the step


_INTERPRETED = """
import json, torch
from triton.runtime.interpreter import InterpretedFunction
from mtpserve.kernels import state_commit_triton as k
from test_state_commit import _cache
assert isinstance(k._commit_kernel, InterpretedFunction)
k.BLOCK = 4                      # several chunks per state, the last one partial
kernel, ref = _cache(torch.bfloat16), _cache(torch.bfloat16)   # two dtypes in one launch
slots, rows, accepted = torch.tensor([3, 1, 0]), torch.tensor([0, 1, 2]), torch.tensor([2, 0, 3])
k.commit_states([(kernel._ssm, kernel._ssm_scratch), (kernel._conv, kernel._conv_scratch)],
                slots, rows, accepted)
one = _cache(torch.bfloat16)     # one pair alone
k.commit_states([(one._conv, one._conv_scratch)], slots, rows, accepted)
for s, r, a in zip(slots.tolist(), rows.tolist(), accepted.tolist()):
    ref.commit(s, r, a)
print("RESULT " + json.dumps([torch.equal(kernel._conv, ref._conv),
                              torch.equal(kernel._ssm, ref._ssm),
                              kernel._ssm[1, 0].unique().tolist(),
                              torch.equal(one._conv, ref._conv),
                              one._ssm.abs().sum().item()]))
"""


def test_commit_kernel_under_triton_interpreter_equals_the_host_commits():
    """kernels/state_commit_triton.py: three sequences (one on the pad scratch row), every
    layer, both state kinds (bfloat16 conv, float32 SSM) in one launch, chunks of 4 elements
    (the last one partial), exactly the host's per-sequence commits; layer 1, slot 0 holds
    scratch row 2 after query token 3; a single pair commits only its own kind."""
    import json
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from interpreted import run_interpreted

    conv, ssm, unique, one_conv, one_ssm = json.loads(run_interpreted(_INTERPRETED, timeout=300))
    assert conv and ssm and unique == [123.0]
    assert one_conv and one_ssm == 0.0          # one pair: only that state kind


def test_commit_kernel_rejects_mismatched_states():
    from mtpserve.kernels.state_commit_triton import commit_states

    cache = _cache()
    idx = torch.tensor([0])
    with pytest.raises(ValueError, match="do not match"):
        commit_states([(cache._conv, cache._ssm_scratch)], idx, idx, idx)
    with pytest.raises(ValueError, match="do not match"):
        commit_states([(cache._ssm, cache._ssm_scratch)], idx, idx, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="do not match"):   # the second pair's other layers
        commit_states([(cache._ssm, cache._ssm_scratch),
                       (cache._conv[:1], cache._conv_scratch[:1])], idx, idx, idx)
    with pytest.raises(ValueError, match="one or two"):
        commit_states([], idx, idx, idx)
