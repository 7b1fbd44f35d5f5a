"""Float32 linear layers on the CPU for a few rows at a time (speculative verify, small batches).

On the CPUs we measured (Xeon, 2 cores, MKL), ``F.linear`` with one row runs as a matrix-vector
product that streams the weights at memory speed, but with 2 to 16 rows MKL's general matrix
product repacks the weights on every call and runs 2-3x slower than one row. Speculation only pays
if verifying k + 1 tokens costs about what decoding one does, so layers also keep a copy of their
weights prepacked once for MKL (``torch.ops.mkl._mkl_reorder_linear_weight``, the packing
PyTorch's inductor uses) and use it whenever more than one row comes in.

Measured (benchmarks/cpu_linear.py on 2 cores): 40 x [3072, 576] weights, one row 11 ms plain;
four rows 25 ms plain, 15 ms packed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Rows the packing is tuned for (MKL's hint); any row count works with the packed weights.
PACK_ROWS = 8


def packing_available() -> bool:
    """True when this torch build has MKL's packed float32 linear."""
    return (torch.backends.mkl.is_available()
            and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
            and hasattr(torch.ops.mkl, "_mkl_linear"))


def pack(weight: torch.Tensor) -> torch.Tensor:
    """MKL-packed copy of a float32 CPU weight [out, in] (as many bytes again as the weight)."""
    return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           packed: torch.Tensor | None) -> torch.Tensor:
    """``x [M, in] @ weight.T + bias``; the packed weights serve M > 1 when given."""
    if packed is None or x.shape[0] <= 1 or x.dim() != 2:
        return F.linear(x, weight, bias)
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, x.shape[0])


def pack_model_linears(model: torch.nn.Module) -> int:
    """Give every module that has a ``packed`` slot a packed copy of its 2-D float32 weight.

    Returns the bytes added. Does nothing (returns 0) without MKL packing.
    """
    if not packing_available():
        return 0
    added = 0
    for module in model.modules():
        w = getattr(module, "weight", None)
        if hasattr(module, "packed") and w is not None and w.dim() == 2 \
                and w.dtype == torch.float32 and w.device.type == "cpu":
            module.packed = pack(w)
            added += w.numel() * w.element_size()
    return added
