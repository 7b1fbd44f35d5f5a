"""CUDA graphs for the MTP draft module's forwards (observe and chained draft steps).

Each MTP forward is one decoder layer (gated full attention + MoE or MLP) plus its fc and norms:
a few dozen small kernels, several times per speculative step (``observe`` over the newly valid
pairs, then one chained step per draft beyond the first). Eagerly on the H200 each costs about as
much host time as a graph replay of the whole target, so the MTP runner captures them like the
target's steps (engine/cuda_graph.py, keyed by token count): the MTP module attends only through
the per-token Triton kernel, so any mix of query lengths fits a graph of the same token count.
The MTP's input hidden states are one more static buffer. Logits are not part of the graph (the
proposer needs them only at each sequence's newest position).

Only a single MTP layer is captured (``step`` then picks layer 0 whatever it is); checkpoints
with several MTP layers run their forwards eagerly.
"""

from __future__ import annotations

import torch

from mtpserve.engine.cuda_graph import CudaGraphRunner
from mtpserve.engine.forward_batch import ForwardBatch


class MTPGraphRunner(CudaGraphRunner):
    """Captured ``mtp(input_ids, hidden, batch)`` for token counts in ``sizes``.

    ``run(batch, hidden [T, H])`` -> MTP output [T, H] in the runner's dtype.
    """

    def _static_batch(self, size: int) -> ForwardBatch:
        batch = super()._static_batch(size)
        hidden = self.runner.model_config.hidden_size
        batch.extra["mtp_hidden"] = torch.zeros(size, hidden, dtype=self.runner.dtype,
                                                device=self.runner.device)
        return batch

    def _forward(self, batch: ForwardBatch):
        y = self.runner.model(batch.input_ids, batch.extra["mtp_hidden"], batch)
        return y, y

    def run(self, batch: ForwardBatch, hidden: torch.Tensor) -> torch.Tensor:
        """Replay with ``hidden`` [T, H] as the MTP's input; the output [T, H] (a view of the
        graph's, valid until its next replay). No logits: nothing is gathered for them."""
        T = batch.num_tokens
        self.graph_for(batch).batch.extra["mtp_hidden"][:T].copy_(hidden)
        return self.replay(batch).hidden[:T]
