"""Feed-forward blocks of Qwen3-Next / Qwen3.5: sparse MoE with a gated shared expert, or dense.

Sparse MoE (Shazeer et al. 2017; Qwen2-MoE / Qwen3-Next layout): a router scores every expert,
softmax, keep the top-k (renormalised to sum 1 when ``norm_topk_prob``), each token's output is
the weighted sum of its experts' SwiGLU outputs, plus a shared SwiGLU expert scaled by
``sigmoid(shared_expert_gate(x))``. Under tensor parallelism every rank holds all experts but only
its slice of their intermediate dimension (like the shared expert's column/row-parallel linears),
so the routed output is summed over ranks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mtpserve.config import ModelConfig
from mtpserve.distributed import get_tp_rank, get_tp_size, tp_all_reduce
from mtpserve.kernels.dispatch import use_gemv, use_triton
from mtpserve.layers.activation import SiluAndMul
from mtpserve.layers.linear import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear


# off: CUDA ends a MoE block with PyTorch's sum over the choices and addcmul (two kernels)
# instead of kernels/moe_combine_triton.py, for benchmarks/gpu_decode.py --compare
COMBINE_KERNEL = True
# off: on CUDA the shared expert runs as its own two products and SiLU-and-mul, not as a
# (k+1)-th choice of the routed experts' kernels (SparseMoeBlock), for gpu_decode.py --compare
FOLD_SHARED_EXPERT = True
# off: a folded block sums its choices in the combine kernel instead of leaving them to the
# next norm (SparseMoeBlock.forward's defer_sum), for gpu_decode.py --compare
DEFER_SUM = True


class GatedMLP(nn.Module):
    """SwiGLU feed-forward ``down(silu(gate(x)) * up(x))``: [T, H] -> [T, H]."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate] * 2)
        self.down_proj = RowParallelLinear(intermediate, hidden)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class FusedExperts(nn.Module):
    """All experts' weights as 3-D tensors (HF's fused layout).

    ``gate_up_proj`` [E + extra, 2 * I_rank, H] (this rank's gate rows, then its up rows) and
    ``down_proj`` [E + extra, H, I_rank]; ``extra`` rows after the E routed experts hold other
    experts of the block's (SparseMoeBlock folds its shared expert there). Loads either the
    fused checkpoint tensors (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H,
    I]; Qwen3.5-MoE and HF state dicts) or one expert's tensor at a time with ``shard_id =
    (expert, "gate" | "up" | "down")`` (Qwen3-Next checkpoints: ``experts.{e}.gate_proj.weight``
    [I, H] ...). Both parameters carry ``num_experts`` (E) for the loader's completeness check.
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int, extra: int = 0):
        super().__init__()
        self.tp_rank, tp = get_tp_rank(), get_tp_size()
        if intermediate % tp:
            raise ValueError(f"moe_intermediate_size {intermediate} is not divisible by TP {tp}")
        self.num_experts, self.inter, self.extra = num_experts, intermediate // tp, extra
        rows = num_experts + extra
        self.gate_up_proj = nn.Parameter(torch.empty(rows, 2 * self.inter, hidden),
                                         requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(rows, hidden, self.inter),
                                      requires_grad=False)
        for p in (self.gate_up_proj, self.down_proj):
            p.weight_loader = self.weight_loader
            p.num_experts = num_experts

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        n, r, E = self.inter, self.tp_rank, self.num_experts
        if shard_id is None:                       # fused [E, 2I, H] or [E, H, I]
            if param is self.down_proj:
                param.data[:E].copy_(loaded.narrow(2, r * n, n))
            else:
                full = loaded.shape[1] // 2
                param.data[:E, :n].copy_(loaded.narrow(1, r * n, n))
                param.data[:E, n:].copy_(loaded.narrow(1, full + r * n, n))
            return
        e, part = shard_id
        if part == "down":
            param.data[e].copy_(loaded.narrow(1, r * n, n))
        else:
            offset = 0 if part == "gate" else n
            param.data[e].narrow(0, offset, n).copy_(loaded.narrow(0, r * n, n))

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                sum_choices: bool = True, extra_choice: bool = False) -> torch.Tensor:
        """x [T, H]; ids, weights [T, k] (expert index, routing weight) -> [T, H] (this rank's
        partial sum under TP), or without ``sum_choices`` [T * k, H], one weighted output per
        (token, choice). On CUDA: the grouped Triton GEMMs of kernels/fused_moe_triton.py
        (no host sync, graph-capturable); with ``extra_choice`` the last choice of each token
        names an extra row (E: a folded shared expert) and the layout is that of the k - 1
        routed ones. Elsewhere the loop over experts below (the reference)."""
        if use_triton(x):
            from mtpserve.kernels.fused_moe_triton import fused_experts

            T, k = ids.shape
            return fused_experts(
                x, ids, weights, self.gate_up_proj, self.down_proj, sum_choices=sum_choices,
                num_experts=self.num_experts + (self.extra if extra_choice else 0),
                routed_rows=T * (k - 1) if extra_choice else None)
        T, k = ids.shape
        flat = ids.flatten()
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        w = weights.flatten()
        # one row per (token, choice), summed over the k choices at the end (index_add_ is
        # slow on contended CPUs and its summation order varies)
        per_choice = x.new_empty(T * k, x.shape[1])
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            pick = order[start:start + n]
            start += n
            gate, up = F.linear(x[pick // k], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[e]) * w[pick].unsqueeze(-1)
            per_choice[pick] = y.to(x.dtype)
        return per_choice.view(T, k, -1).sum(1) if sum_choices else per_choice


class SparseMoeBlock(nn.Module):
    """Router + routed experts + sigmoid-gated shared expert: [T, H] -> [T, H].

    Checkpoint names (vLLM / HF): ``gate`` (router [E, H]), ``experts.*``, ``shared_expert.*``,
    ``shared_expert_gate`` ([1, H]).

    On CUDA the router and the shared expert gate are one [E + 1, H] matrix (router rows, then
    the gate's row; see :meth:`merge_router_weights`): ``gate.weight`` and
    ``shared_expert_gate.weight`` are views of it, so checkpoints load through them as before,
    one skinny product gives both, and kernels/moe_router_triton.py's ``route`` does softmax,
    top-k, renormalisation and the gate's sigmoid in one kernel. The logits stay float32 there
    (PyTorch's path, like HF's, rounds them to the model dtype first), and equal logits go to
    the lowest expert index. Elsewhere the plain-PyTorch path below (the reference).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hf = cfg.hf_config
        self.top_k = hf.num_experts_per_tok
        self.num_experts = hf.num_experts
        # Qwen3.5-MoE always renormalises the top-k weights (its config has no flag)
        self.renormalize = bool(getattr(hf, "norm_topk_prob", True))
        self.gate = ReplicatedLinear(cfg.hidden_size, hf.num_experts)
        # a shared expert as wide as the routed ones lives in the experts' row E (see
        # fold_shared_expert): on CUDA it runs as one more choice of their kernels
        fold = hf.shared_expert_intermediate_size == hf.moe_intermediate_size
        self.experts = FusedExperts(hf.num_experts, cfg.hidden_size, hf.moe_intermediate_size,
                                    extra=int(fold))
        self.shared_expert = GatedMLP(cfg.hidden_size, hf.shared_expert_intermediate_size)
        self.shared_expert_gate = ReplicatedLinear(cfg.hidden_size, 1)
        self._router: torch.Tensor | None = None    # [E + 1, H] once merged
        if self.gate.weight.is_cuda:
            self.merge_router_weights()
        self.fold_shared_expert()

    def fold_shared_expert(self) -> bool:
        """Where the experts hold a row for it (a shared expert as wide as a routed one), make
        the shared expert's ``gate_up_proj`` [2I, H] and ``down_proj`` [H, I] weights views of
        the experts' row E (their values copied there first); returns whether folded. Done at
        construction and again after every move (``.to()`` copies parameters one by one, which
        unties the views; both copies then hold the same values). Checkpoints load through the
        views as before; the CPU runs the shared expert as its own MLP over them."""
        if not self.experts.extra:
            return False
        E = self.num_experts
        for p, rows in self._shared_rows():
            if not _views_row(p, rows, E):
                rows.data[E].copy_(p.data)
                p.data = rows.data[E]
        return True

    def _shared_rows(self):
        """(the shared expert's weight, the experts' tensor whose row E holds it), each kind."""
        return ((self.shared_expert.gate_up_proj.weight, self.experts.gate_up_proj),
                (self.shared_expert.down_proj.weight, self.experts.down_proj))

    def merge_router_weights(self) -> torch.Tensor:
        """Put ``gate.weight`` [E, H] and ``shared_expert_gate.weight`` [1, H] into one
        contiguous [E + 1, H] tensor (router rows, then the gate's row) and make the two
        parameters views of it; returns it. Done at construction on CUDA and again after every
        move that leaves the block on CUDA (``.to()`` copies parameters one by one, which would
        untie them); a no-op when already merged. Values are kept; loading afterwards writes
        through the views. Any device (tests merge on the CPU too)."""
        g, s = self.gate.weight, self.shared_expert_gate.weight
        w = self._merged_router()
        if w is None:
            w = torch.cat([g.data, s.data])
            g.data, s.data = w[:self.num_experts], w[self.num_experts:]
            self._router = w
        return w

    def _merged_router(self) -> torch.Tensor | None:
        """The merged [E + 1, H] weight if both parameters are still views of it, else None."""
        w = self._router
        if w is None or self.gate.weight.data_ptr() != w.data_ptr() \
                or self.shared_expert_gate.weight.data_ptr() != w[self.num_experts:].data_ptr():
            return None
        return w

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.gate.weight.is_cuda:
            self.merge_router_weights()
        else:
            self._router = None
        self.fold_shared_expert()
        return self

    def forward(self, x: torch.Tensor, defer_sum: bool = False):
        """x [T, H] -> [T, H]; with ``defer_sum`` on CUDA, where the shared expert runs folded,
        the (k+1) weighted outputs per token as ``SplitKPartials`` instead (a view of them, no
        kernel), for the next ``RMSNorm.add_norm`` to sum in its own kernel: the same bits as
        the combine kernel then the residual add."""
        if use_triton(x):
            return self._forward_triton(x, defer_sum)
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        routed = tp_all_reduce(self.experts(x, ids, weights.to(x.dtype)))
        shared = self.shared_expert(x) * torch.sigmoid(self.shared_expert_gate(x))
        return routed + shared

    def _runs_folded(self, tokens: int | None = None) -> bool:
        """Whether the CUDA forward runs the shared expert inside the routed experts' kernels:
        folded (and still tied), one TP rank (the routed sum is all-reduced before the shared
        expert's own all-reduced output is added), the switches on, and (given ``tokens``) a
        step whose routed rows take one block each (decode, verify: ``ONE_ROW_BLOCKS``);
        prefill keeps the shared expert's own products (large, on cuBLAS) and the sort by
        routed experts alone."""
        if not (FOLD_SHARED_EXPERT and COMBINE_KERNEL and self.experts.extra > 0
                and get_tp_size() == 1 and self._tied()):
            return False
        if tokens is None:
            return True
        from mtpserve.kernels.fused_moe_triton import ONE_ROW_BLOCKS

        return tokens * self.top_k <= ONE_ROW_BLOCKS

    def _tied(self) -> bool:
        """The shared expert's weights still views of the experts' row E."""
        return all(_views_row(p, rows, self.num_experts) for p, rows in self._shared_rows())

    def _forward_triton(self, x: torch.Tensor, defer_sum: bool = False):
        """CUDA: one product for the router and the shared expert gate (float32 logits, see
        :func:`_router_logits`), the routing kernel, the grouped expert GEMMs, and the sum over
        each token's choices in one kernel (kernels/moe_combine_triton.py). A folded shared
        expert (:meth:`fold_shared_expert`) is one more choice of those GEMMs, weighed by its
        gate: 5 kernels a layer, 4 when the next norm sums the choices (``defer_sum``; decode
        and verify steps, :meth:`_runs_folded`). Otherwise the shared expert's own products
        and SiLU-and-mul, and ``+ shared * gate`` in the combine kernel (under TP: the sum, the
        all-reduce, then ``addcmul``)."""
        from mtpserve.kernels.moe_router_triton import route

        w = self._merged_router()
        if w is not None and self._runs_folded(x.shape[0]):
            from mtpserve.kernels.moe_combine_triton import moe_combine

            # the shared expert as choice k + 1 (expert E, weighed by its gate); layout and
            # tiles as for the routed rows alone
            ids, weights, _ = route(_router_logits(x, w), self.top_k, self.renormalize,
                                    shared_gate=True, out_dtype=x.dtype, append_shared=True)
            per_choice = self.experts(x, ids, weights, sum_choices=False, extra_choice=True)
            # a few tokens only (the folded steps): the partials outlive this call until the
            # next norm, next to the next layer's own
            if defer_sum and DEFER_SUM:   # choice c of token t at row t (k + 1) + c
                from mtpserve.kernels.gemv_triton import SplitKPartials

                k1 = self.top_k + 1
                return SplitKPartials(per_choice.view(-1, k1, x.shape[1]).transpose(0, 1),
                                      x.dtype)
            return moe_combine(per_choice, k=self.top_k + 1)
        if w is not None:
            ids, weights, gate = route(_router_logits(x, w), self.top_k, self.renormalize,
                                       shared_gate=True, out_dtype=x.dtype)
        else:                                       # untied (e.g. a deep copy): two products
            ids, weights, _ = route(self.gate(x), self.top_k, self.renormalize,
                                    out_dtype=x.dtype)
            gate = torch.sigmoid(self.shared_expert_gate(x))
        if COMBINE_KERNEL and get_tp_size() == 1:
            from mtpserve.kernels.moe_combine_triton import moe_combine

            per_choice = self.experts(x, ids, weights, sum_choices=False)
            return moe_combine(per_choice, self.shared_expert(x), gate)
        routed = tp_all_reduce(self.experts(x, ids, weights))
        return torch.addcmul(routed, self.shared_expert(x), gate)


def _views_row(p: torch.Tensor, rows: torch.Tensor, e: int) -> bool:
    """Whether ``p`` starts at row ``e`` of ``rows`` (pointers only: no view is made)."""
    return p.data_ptr() == rows.data_ptr() + e * rows.stride(0) * rows.element_size()


# torch >= 2.8: cuBLAS products of 16-bit inputs with a float32 output (aten::mm.dtype)
_MM_OUT_DTYPE = hasattr(torch.ops.aten.mm, "dtype")


def _router_logits(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [T, H] @ w[E + 1, H]^T`` in float32, unrounded to x's 16-bit dtype: router logits
    rounded to bfloat16 tie often among hundreds of experts and move the top-k boundary, and
    the same float32 logits at every batch size keep a token's routing the same in decode,
    verify and prefill. The skinny Triton product where it applies (``use_gemv``: up to
    ``gemv_triton.MAX_ROWS`` rows of 16-bit x), else cuBLAS (float32 models: ``F.linear``; a
    torch without ``mm.dtype``: ``F.linear`` too, logits in x's dtype)."""
    if use_gemv(x, w):
        from mtpserve.kernels.gemv_triton import gemv

        return gemv(x, w, out_dtype=torch.float32)
    if _MM_OUT_DTYPE and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) \
            and w.dtype == x.dtype:
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    return F.linear(x, w)


def uses_moe(cfg: ModelConfig, layer_idx: int) -> bool:
    """Whether decoder layer ``layer_idx`` has a sparse MoE (else a dense SwiGLU MLP).

    Qwen3.5 dense (``qwen3_5_text``): never; Qwen3.5-MoE: always; Qwen3-Next: when it has experts,
    the layer is not in ``mlp_only_layers`` and ``(layer_idx + 1) % decoder_sparse_step == 0``.
    """
    hf = cfg.hf_config
    if cfg.model_type == "qwen3_5_text":
        return False
    if cfg.model_type == "qwen3_5_moe_text":
        return True
    step = getattr(hf, "decoder_sparse_step", 1) or 1
    return (getattr(hf, "num_experts", 0) or 0) > 0 \
        and layer_idx not in (getattr(hf, "mlp_only_layers", None) or []) \
        and (layer_idx + 1) % step == 0


def build_mlp(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    """The feed-forward block of decoder layer ``layer_idx`` (see :func:`uses_moe`)."""
    if uses_moe(cfg, layer_idx):
        return SparseMoeBlock(cfg)
    return GatedMLP(cfg.hidden_size, cfg.intermediate_size)
