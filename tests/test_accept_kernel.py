"""The greedy acceptance kernel (kernels/accept_triton.py) under Triton's interpreter (in a
subprocess: tests/interpreted.py) against spec/draft_ahead.py's PyTorch path, and through
``uniform_acceptance``'s dispatch; its input checks. The verify graphs on CUDA take it:
tests/test_gpu.py's hybrid / MTP tests."""

from __future__ import annotations

import json

import pytest
import torch

from interpreted import run_interpreted

_CODE = """
import json, torch
from unittest import mock
from triton.runtime.interpreter import InterpretedFunction
from mtpserve.kernels import accept_triton
from mtpserve.spec import draft_ahead
assert isinstance(accept_triton._accept_kernel, InterpretedFunction)
g = torch.Generator().manual_seed(0)
cases = bad = 0
for B in (1, 2, 5):
    for k in (1, 2, 3, 4, 7):
        for trial in range(6):
            # drafts drawn from 2 values: every prefix length comes up
            ids = torch.randint(0, 2, (B * (k + 1),), generator=g)
            tgt = torch.randint(0, 2, (B * (k + 1),), generator=g)
            if trial == 0:   # all accepted
                tgt.view(B, k + 1)[:, :k] = ids.view(B, k + 1)[:, 1:]
            want = draft_ahead.uniform_acceptance(ids, tgt, B, k)          # PyTorch (CPU)
            got = accept_triton.accepted_prefix(ids, tgt, B, k)
            with mock.patch.object(draft_ahead, "use_triton", lambda x: True):
                out = torch.full((B,), -1, dtype=torch.int64)
                via = draft_ahead.uniform_acceptance(ids, tgt, B, k, out=out)
            cases += 1
            bad += int(not (torch.equal(got, want) and torch.equal(via, want) and via is out))
print("RESULT", json.dumps([cases, bad]))
"""


def test_acceptance_kernel_equals_the_pytorch_path_under_triton_interpreter():
    cases, bad = json.loads(run_interpreted(_CODE, timeout=300))
    assert (cases, bad) == (90, 0)


def test_acceptance_kernel_checks_its_operands():
    pytest.importorskip("triton")
    from mtpserve.kernels.accept_triton import accepted_prefix

    ids = torch.zeros(8, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"expected contiguous \[8\] int64 for 2 sequences"):
        accepted_prefix(ids, ids.int(), 2, 3)
    with pytest.raises(ValueError, match=r"expected contiguous \[6\] int64 for 2 sequences of 2"):
        accepted_prefix(ids, ids, 2, 2)                     # 2 x 3 tokens, not 8
    with pytest.raises(ValueError, match=r"out \(3,\)"):
        accepted_prefix(ids, ids, 2, 3, out=torch.zeros(3, dtype=torch.int64))
