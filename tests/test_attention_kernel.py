"""The Triton paged attention (kernels/paged_attention_triton.py) on the CPU under Triton's
interpreter (float32, in a subprocess: tests/interpreted.py): partitions spread over short
contexts, one program per (token, KV head) over all its partitions (the pair kernel), and the
separate merge kernel. The same checks in float32 and bfloat16 on CUDA: tests/test_gpu.py."""

from __future__ import annotations

import json

from interpreted import run_interpreted

_CODE = """
import json
from triton.runtime.interpreter import InterpretedFunction
from mtpserve.kernels import paged_attention_triton
import attention_check
assert isinstance(paged_attention_triton._partial_kernel, InterpretedFunction)
print("RESULT", json.dumps(attention_check.check_paged_attention("cpu", 4, 2, 32, "float32")))
"""


def test_paged_attention_under_triton_interpreter():
    """check_paged_attention("cpu", Hq 4, Hkv 2, D 32): 5 sequences (1 to 9 query tokens,
    contexts 1 to 300 keys), partitions of 64 and 256 keys: within 1e-5 of float64; the same
    bits from every grid (the pair kernel, two programs per (token, KV head), one per partition)
    and for a token alone as in its batch."""
    worst = json.loads(run_interpreted(_CODE))
    assert set(worst) == {"64", "256"} and all(0 < e < 1e-5 for e in worst.values()), worst


_EMPTY = """
import json, torch
from mtpserve.kernels.paged_attention_triton import paged_attention_triton
k = torch.randn(32, 2, 16)
tables = torch.zeros(1, 2, dtype=torch.int32)
none = torch.zeros(0, dtype=torch.int32)
shapes = [list(paged_attention_triton(torch.zeros(0, 4, 16), k, k, tables, none, none, 0.25, 16,
                                      16, grid).shape) for grid in (None, 1, 2)]
print("RESULT", json.dumps(shapes))
"""


def test_paged_attention_of_no_tokens():
    """No query tokens (no (token, KV head) pair to size the grid by): an empty [0, Hq, D] output
    with the default grid as with a given one, not a division by zero."""
    assert json.loads(run_interpreted(_EMPTY)) == [[0, 4, 16]] * 3


_EARLY = """
import attention_check
print("RESULT", attention_check.check_early_kv("cpu", 4, 2, 32, "float32"))
"""


def test_early_kv_attention_under_triton_interpreter():
    """check_early_kv("cpu", Hq 4, Hkv 2, D 32) of tests/attention_check.py: with
    paged_attention_triton.EARLY_KV the loads before the PDL wait read a copy of the caches
    whose step positions hold other values, and the output is bit-equal to EARLY_KV off for 4
    sequences of 1 to 4 query tokens at partitions of 64 and 256 keys and three grids (6
    cases); a changed older position is seen."""
    assert int(run_interpreted(_EARLY)) == 6
