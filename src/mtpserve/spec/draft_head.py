"""The LM head that MTP drafts go through: the target's own, or one over a token subset (FR-Spec).

An MTP draft step ends in the target's LM head: [vocab, H] weights (~152k x 2048 in bf16, 0.6
GB for Qwen3-Next) read per draft step, most of the drafting cost on the GPU. FR-Spec (Zhao et
al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via Frequency-Ranked
Speculative Sampling", arXiv 2502.14856) drafts over a frequency-ranked subset of the
vocabulary instead; SGLang calls the subset's file ``--speculative-token-map``.

Lossless either way: verification runs the target's full head (engine/model_runner.py). A
greedy draft only decides what is proposed. A sampled draft is drawn from the subset head's
distribution and records exactly that distribution as q (zero outside the subset), so
speculative sampling (accept with min(1, p(x) / q(x)), else draw from normalize(max(0, p - q));
spec/verify.py) still emits tokens distributed as p.

Both heads answer ``greedy(hidden)`` and ``logits(hidden)`` with the same shapes; the proposer
(spec/mtp.py) and the draft chain (spec/mtp_chain.py) call nothing else. Either may take its
greedy drafts through an FP8 copy of its weight (:class:`Fp8GreedyHead`,
``--speculative-draft-head-quantization fp8``): half the bytes a draft step, lossless as well.
"""

from __future__ import annotations

import torch

from mtpserve.kernels import cpu_linear
from mtpserve.kernels.argmax_triton import row_argmax
from mtpserve.kernels.fp8_head_triton import MAX_ROWS as FP8_MAX_ROWS
from mtpserve.kernels.fp8_head_triton import fp8_logits, quantize_rows
from mtpserve.layers.embedding import vocab_logits
from mtpserve.spec.token_map import check_token_ids


class FullVocabHead:
    """The target's full LM head: MTP drafting without a token map, exactly as the target
    computes logits.

    Args:
        target: the target model; ``target.compute_logits(hidden [N, H]) -> [N, vocab]``
            float32.
    """

    def __init__(self, target):
        self.target = target

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` [N, H] (runner dtype) -> float32 logits [N, vocab]."""
        return self.target.compute_logits(hidden)

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` [N, H] -> argmax ids [N] int64 on the device (no host sync; one kernel
        on CUDA: kernels/argmax_triton.py)."""
        return row_argmax(self.logits(hidden))


class ReducedVocabHead:
    """FR-Spec draft head: the target's LM head restricted to ``V_sub`` token ids.

    At construction the selected rows of ``lm_head.weight`` are copied into a contiguous
    ``weight`` [V_sub, H] of the target's dtype and device (a tied head, whose weight is the
    embedding table, is only read), beside ``ids`` [V_sub] int64 on that device, ascending, so
    ties break to the lowest id as the full head's argmax does. The logits are the same product
    as the full head's (``layers.embedding.vocab_logits``: float32 output; the Triton skinny
    product or cuBLAS on CUDA, MKL with a packed copy on a CPU whose full head has one).
    Nothing reads the host after construction: CUDA-graph capturable, static shapes.

    Tensor parallelism: not supported. Under TP each rank holds a vocabulary slice of the head;
    the subset would need each rank's local rows, a gather of unequal parts and a map from
    gathered columns back to ids. The engine runs TP = 1 today, so a head with
    ``tp_size > 1`` raises instead of drafting wrongly.

    Args:
        lm_head: the target's ``ParallelLMHead`` (``weight`` [vocab, H], ``vocab_size``,
            ``tp_size``, ``packed``).
        token_ids: [V_sub] integer ids, any order, any device (spec/token_map.py reads them).

    Raises:
        ValueError: ``lm_head.tp_size > 1``; ``token_ids`` not a 1-D integer tensor, empty,
            with a duplicate or an id outside ``[0, vocab)``.
    """

    def __init__(self, lm_head, token_ids: torch.Tensor):
        if getattr(lm_head, "tp_size", 1) > 1:
            raise ValueError(f"--speculative-token-map is not supported with tensor parallelism "
                             f"(TP = {lm_head.tp_size}); run TP = 1 or drop the token map")
        w = lm_head.weight.detach()
        self.vocab_size = lm_head.vocab_size
        ids = check_token_ids(token_ids, self.vocab_size)
        self.ids = ids.sort().values.to(w.device)
        self.weight = w.index_select(0, self.ids).contiguous()
        self.packed = None
        if getattr(lm_head, "packed", None) is not None:   # CPU float32 with MKL packing
            self.packed = cpu_linear.pack(self.weight)

    def reduced_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` [N, H] (the weight's dtype) -> float32 logits [N, V_sub]; column j is
        token ``ids[j]``."""
        return vocab_logits(hidden, self.weight, self.packed)

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` [N, H] -> [N] int64 full-vocabulary ids ``ids[argmax]``, on the device (no
        host sync): the argmax of the full logits with every column outside the subset masked,
        up to rounding (the smaller product may run other kernels or tiles than the full head's,
        so a near-tie can go the other way; that changes which token is proposed, never the
        output). On CUDA the argmax and the id lookup are one kernel (kernels/argmax_triton.py)."""
        return row_argmax(self.reduced_logits(hidden), self.ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` [N, H] -> float32 logits [N, vocab]: the subset's values at their ids,
        -inf everywhere else (the sampler then gives those tokens probability 0). A row whose
        subset tokens are all banned (``min_tokens`` with a map of end ids only) has no finite
        logit left: its q is NaN and the token drawn lies outside the map, which verification
        always rejects (``q(x) > 0`` fails) before sampling from p: drafts wasted, output
        exact."""
        small = self.reduced_logits(hidden)
        full = small.new_full((small.shape[0], self.vocab_size), float("-inf"))
        return full.index_copy_(1, self.ids, small)


class Fp8GreedyHead:
    """A draft head (``base``) whose greedy drafts go through an FP8 E4M3 copy of its weight
    with one scale per row (kernels/fp8_head_triton.py): for the 152k-row head of Qwen3-Next,
    0.31 GB read a draft step instead of 0.62. ``logits`` (sampled drafts, whose q must be
    the distribution they were drawn from) stays ``base``'s.

    Lossless like the FR-Spec head: a greedy draft only decides what is proposed, and
    verification runs the target's own head. The FP8 logits differ from ``base``'s by the
    weight's rounding (3 mantissa bits a weight, summed over H inputs), so where ``base``'s two
    best tokens are close the draft may be the other one; that costs acceptance, never output.

    Args:
        base: a :class:`FullVocabHead` (the target's LM head: its first ``vocab_size`` rows
            are quantized) or :class:`ReducedVocabHead` (its subset weight and ids).

    Raises:
        ValueError: a target LM head split over tensor-parallel ranks.
    """

    def __init__(self, base: FullVocabHead | ReducedVocabHead):
        self.base = base
        if isinstance(base, ReducedVocabHead):
            weight, self.ids = base.weight, base.ids
        else:
            lm_head = base.target.lm_head
            if getattr(lm_head, "tp_size", 1) > 1:
                raise ValueError(f"--speculative-draft-head-quantization is not supported with "
                                 f"tensor parallelism (TP = {lm_head.tp_size})")
            weight, self.ids = lm_head.weight.detach()[: lm_head.vocab_size], None
        self.w8, self.scale = quantize_rows(weight)

    def nbytes(self) -> int:
        """Bytes the FP8 copy holds (weight and scales)."""
        return self.w8.numel() + self.scale.numel() * 4

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` [N, H] -> [N] int64 draft ids, the argmax of the FP8 logits (through the
        subset's ids for an FR-Spec base); more than the kernel's rows: ``base``'s. No host
        sync; two launches on CUDA (the product, then the argmax)."""
        if hidden.shape[0] > FP8_MAX_ROWS:
            return self.base.greedy(hidden)
        return row_argmax(fp8_logits(hidden, self.w8, self.scale), self.ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``base``'s logits (exact: sampled drafts record them as q)."""
        return self.base.logits(hidden)


def build_draft_head(target, token_ids: torch.Tensor | None, quantization: str | None = None
                     ) -> FullVocabHead | ReducedVocabHead | Fp8GreedyHead:
    """The draft head of ``target``: its full LM head (``token_ids`` None) or the FR-Spec head
    over ``token_ids`` [V_sub], with ``quantization`` "fp8" behind :class:`Fp8GreedyHead`
    (same errors as :class:`ReducedVocabHead` and :class:`Fp8GreedyHead`)."""
    head = (FullVocabHead(target) if token_ids is None
            else ReducedVocabHead(target.lm_head, token_ids))
    return Fp8GreedyHead(head) if quantization == "fp8" else head
