"""Linear layers that know how to take their slice of a checkpoint under tensor parallelism.

Names and sharding follow vLLM (Megatron-LM, Shoeybi et al. 2019): a column-parallel layer splits
its output features over the TP ranks, a row-parallel layer splits its input features and sums the
partial products with an all-reduce. Each parameter carries ``weight_loader(param, loaded,
shard_id=None)``, so model files load weights the same way at any TP size. At TP=1 these are
plain ``F.linear``.
"""

from __future__ import annotations

import torch
from torch import nn

from mtpserve.distributed import get_tp_rank, get_tp_size, tp_all_reduce
from mtpserve.kernels import cpu_linear
from mtpserve.kernels.dispatch import use_gemv


def _divide(n: int, d: int) -> int:
    if n % d:
        raise ValueError(f"{n} is not divisible by the tensor-parallel size {d}")
    return n // d


class LinearBase(nn.Module):
    """``y = x W^T + b`` with ``W`` [out_features, in_features] (this rank's part)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    # CPU float32 only: MKL-prepacked weights for calls with several rows (kernels/cpu_linear.py)
    packed: torch.Tensor | None = None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._product(x, self.bias)

    def _product(self, x: torch.Tensor, bias: torch.Tensor | None, defer_sum: bool = False,
                 silu_input: bool = False):
        if silu_input or not isinstance(x, torch.Tensor):   # an input fused in front (CUDA)
            from mtpserve.kernels.gemv_triton import gemv_fused_input

            return gemv_fused_input(x, self.weight, bias, silu_input=silu_input)
        if use_gemv(x, self.weight):   # CUDA decode / verify: a few rows, weight-bandwidth bound
            from mtpserve.kernels.gemv_triton import gemv

            return gemv(x, self.weight, bias, defer_sum=defer_sum)
        return cpu_linear.linear(x, self.weight, bias, self.packed)


class ReplicatedLinear(LinearBase):
    """The full weight on every rank."""


class ColumnParallelLinear(LinearBase):
    """Output features split over TP ranks; input replicated; output stays sharded."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        super().__init__(in_features, _divide(out_features, self.tp_size), bias)

    def weight_loader(self, param, loaded, shard_id=None):
        size = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.tp_rank * size, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs stacked in one matrix (e.g. gate and up projections).

    ``shard_id`` is the index into ``output_sizes`` of the checkpoint tensor being loaded.
    """

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias)

    def weight_loader(self, param, loaded, shard_id=None):
        sizes = [s // self.tp_size for s in self.output_sizes]
        offset = sum(sizes[:shard_id])
        part = loaded.narrow(0, self.tp_rank * sizes[shard_id], sizes[shard_id])
        param.data.narrow(0, offset, sizes[shard_id]).copy_(part)


class QKVParallelLinear(ColumnParallelLinear):
    """Query, key and value projections in one matrix, split by heads over TP ranks.

    Output layout per rank: [q heads | k heads | v heads] x ``head_dim``. When there are fewer KV
    heads than ranks, KV heads are replicated. ``q_size_factor`` widens q (2 for Qwen3-Next's
    query + output gate). ``shard_id`` is ``"q"``, ``"k"`` or ``"v"``.
    """

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False, q_size_factor: int = 1):
        tp = get_tp_size()
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, tp)
        self.num_kv_heads = max(1, num_kv_heads // tp)
        self.kv_replicas = max(1, tp // num_kv_heads)
        self.q_size = self.num_heads * head_dim * q_size_factor
        self.kv_size = self.num_kv_heads * head_dim
        total = (self.q_size + 2 * self.kv_size) * tp
        super().__init__(hidden_size, total, bias)

    def weight_loader(self, param, loaded, shard_id=None):
        if shard_id == "q":
            offset, size, rank = 0, self.q_size, self.tp_rank
        else:
            offset = self.q_size + (0 if shard_id == "k" else self.kv_size)
            size, rank = self.kv_size, self.tp_rank // self.kv_replicas
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, rank * size, size))


class RowParallelLinear(LinearBase):
    """Input features split over TP ranks; the partial outputs are summed (all-reduce)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        super().__init__(_divide(in_features, self.tp_size), out_features, bias)

    def weight_loader(self, param, loaded, shard_id=None):
        if param.dim() == 1:  # bias: added once, after the reduction
            param.data.copy_(loaded)
            return
        size = param.shape[1]
        param.data.copy_(loaded.narrow(1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor, defer_sum: bool = False, silu_input: bool = False):
        """``x`` [T, in/tp] -> [T, out] summed over the TP ranks (+ bias). ``defer_sum``: on one
        rank, without bias, a split-K skinny product may return its partials
        (``gemv_triton.SplitKPartials``) for the next kernel to sum (``RMSNorm.add_norm`` does).
        ``silu_input`` (where ``gemv_triton.fused_input_fits``): ``x`` is [1, 2 in/tp] =
        [gate | up] and the product takes ``silu(gate) * up`` in its own programs."""
        if silu_input:
            y = tp_all_reduce(self._product(x, None, silu_input=True))
            return y if self.bias is None else y + self.bias
        if defer_sum and self.tp_size == 1 and self.bias is None:
            return self._product(x, None, defer_sum=True)
        y = tp_all_reduce(self._product(x, None))
        return y if self.bias is None else y + self.bias
