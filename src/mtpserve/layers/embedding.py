"""Token embedding and LM head, split over the vocabulary under tensor parallelism."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mtpserve.distributed import get_tp_rank, get_tp_size, tp_all_reduce
from mtpserve.kernels import cpu_linear
from mtpserve.kernels.dispatch import use_gemv


class VocabParallelEmbedding(nn.Module):
    """Embedding table [vocab, hidden]; each TP rank holds a contiguous slice of the vocabulary.

    ``forward(ids [T] int64) -> [T, hidden]``: rows outside this rank's slice read as zero and
    the all-reduce fills them in.
    """

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.vocab_size = vocab_size
        self.part = (vocab_size + self.tp_size - 1) // self.tp_size
        self.start = self.tp_rank * self.part
        self.weight = nn.Parameter(torch.empty(self.part, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        rows = loaded[self.start:self.start + self.part]
        param.data[: rows.shape[0]].copy_(rows)
        param.data[rows.shape[0]:].zero_()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        inside = (local >= 0) & (local < self.part)
        out = F.embedding(local.clamp(0, self.part - 1), self.weight) * inside.unsqueeze(-1)
        return tp_all_reduce(out)

    def lookup_normed(self, ids: torch.Tensor, norm, out: torch.Tensor,
                      raw_out: torch.Tensor | None = None) -> torch.Tensor:
        """CUDA: ``norm(self(ids))`` written into ``out`` [T, hidden] (a view of a wider buffer
        is fine) and returned, with ``raw_out`` the embedding itself too; ``norm``: an RMSNorm.
        One kernel (``fused_triton.embed_rms_norm``: the rows read once, by id) on one TP rank
        when ``out`` has the table's dtype; else the lookup, then the norm kernel."""
        from mtpserve.kernels.fused_triton import embed_rms_norm, rms_norm

        if self.tp_size == 1 and out.dtype == self.weight.dtype:
            return embed_rms_norm(ids, self.weight, norm.weight, norm.eps, norm.zero_centered,
                                  out, raw_out=raw_out)
        e = self(ids)
        if raw_out is not None:
            raw_out.copy_(e)
        return rms_norm(e, norm.weight, norm.eps, norm.zero_centered, out=out)


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection hidden -> vocabulary logits; may share its weight with the embedding.

    ``forward(hidden [N, H]) -> logits [N, vocab] float32`` (gathered over TP ranks).
    """

    packed: torch.Tensor | None = None  # see kernels/cpu_linear.py

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = vocab_logits(hidden, self.weight, self.packed)
        if self.tp_size > 1:
            parts = [torch.empty_like(logits) for _ in range(self.tp_size)]
            torch.distributed.all_gather(parts, logits)
            logits = torch.cat(parts, dim=-1)
        return logits[:, : self.vocab_size]


def vocab_logits(hidden: torch.Tensor, weight: torch.Tensor,
                 packed: torch.Tensor | None = None) -> torch.Tensor:
    """``hidden [N, H] @ weight [R, H]^T`` -> float32 logits [N, R] (one rank's rows, or any
    row subset of an LM head: spec/draft_head.py).

    CUDA 16-bit: the skinny Triton product when it applies, else cuBLAS with float32 output
    (rounding logits to bf16, steps of 0.125 near 20, would turn near-ties into ties); CPU:
    ``cpu_linear.linear`` with the MKL-packed copy ``packed`` for several rows.
    """
    if use_gemv(hidden, weight):
        from mtpserve.kernels.gemv_triton import gemv

        return gemv(hidden, weight, out_dtype=torch.float32)
    if hidden.is_cuda and hidden.dtype != torch.float32:
        return torch.mm(hidden, weight.t(), out_dtype=torch.float32)
    return cpu_linear.linear(hidden, weight, None, packed).float()
