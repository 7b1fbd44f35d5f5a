"""The MTP (multi-token prediction) draft module shipped in Qwen3-Next / Qwen3.5 checkpoints.

Checkpoint tensors ``mtp.*``: ``fc`` (Linear 2H -> H, no bias), ``pre_fc_norm_embedding`` and
``pre_fc_norm_hidden`` (zero-centred RMSNorm), ``layers.{i}`` (a decoder layer with gated FULL
attention and the model's FFN kind, its own KV cache, no recurrent state), ``norm``. The token
embedding and the LM head are the target model's.

One draft step for a sequence whose target hidden state at position t is h_t (after the target's
final norm) and whose next token is x_{t+1}:

    y = norm(layer(fc(cat(norm_e(embed(x_{t+1})), norm_h(h_t)))))    at position t
    logits = target.lm_head(y)

Conventions (as vLLM's ``qwen3_next_mtp.py`` + ``v1/spec_decode/eagle.py`` and SGLang's
``qwen3_next_mtp.py`` + EAGLE worker do):

- position: the pair (h_t, x_{t+1}) sits at position t (the hidden state's position) for RoPE
  and for the slot in the MTP's KV cache, so the MTP cache mirrors the target's positions;
  the k-th chained draft step of a sequence uses position t + k - 1;
- chaining: step k + 1 is fed the output y of step k (AFTER ``mtp.norm``, the same tensor the LM
  head reads) as its hidden state, with the token drafted at step k.
With several MTP layers, step s uses ``layers[s % n]`` (vLLM's ``spec_step_idx``).
"""

from __future__ import annotations

import torch
from torch import nn

from mtpserve.config import ModelConfig
from mtpserve.engine.forward_batch import ForwardBatch
from mtpserve.kernels.dispatch import use_triton
from mtpserve.layers.attention import Attention
from mtpserve.layers.embedding import VocabParallelEmbedding
from mtpserve.layers.linear import ReplicatedLinear
from mtpserve.layers.norm import RMSNorm
from mtpserve.layers.rotary import RotaryEmbedding
from mtpserve.models.qwen3_next import HybridDecoderLayer


class Qwen3NextMTP(nn.Module):
    """MTP draft module of a Qwen3-Next / Qwen3.5 target.

    Args:
        cfg: the target's config (``mtp_num_hidden_layers`` layers are built);
        embed_tokens, rotary: the target's embedding and RoPE tables (shared, not owned).

    ``forward(input_ids [T] int64, hidden [T, H], batch, step=0) -> [T, H]`` (after
    ``mtp.norm``; logits come from the target's ``compute_logits``). ``batch`` is a ForwardBatch
    over the MTP's OWN KV cache: ``batch.kv_caches[i]`` is layer i's (``attention_layers()[i]``
    has ``layer_idx`` i), ``batch.positions`` follow the convention in the module docstring.
    """

    def __init__(self, cfg: ModelConfig, embed_tokens: VocabParallelEmbedding,
                 rotary: RotaryEmbedding):
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        n = int(cfg.hf_config.mtp_num_hidden_layers)
        self.fc = ReplicatedLinear(2 * H, H)
        self.pre_fc_norm_embedding = RMSNorm(H, eps, zero_centered=True)
        self.pre_fc_norm_hidden = RMSNorm(H, eps, zero_centered=True)
        # the FFN kind follows layer 0's rule (vLLM builds the MTP layer with index 0)
        self.layers = nn.ModuleList(HybridDecoderLayer(cfg, rotary, "full_attention", i, 0)
                                    for i in range(n))
        self.norm = RMSNorm(H, eps, zero_centered=True)
        self._shared = (embed_tokens, rotary)   # a tuple: not registered as submodules

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.layers]

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, batch: ForwardBatch,
                step: int = 0) -> torch.Tensor:
        embed, rotary = self._shared
        x = self.fc(self._fc_input(input_ids, hidden))
        rope = rotary.lookup(batch.positions, x.dtype)
        layer = self.layers[step % len(self.layers)]
        h, residual = layer.forward_residual(rope, x, None, batch)
        return self.norm.add_norm(h, residual)[0]   # the layer's residual add inside the norm

    def _fc_input(self, input_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """``fc``'s input [T, 2H]: the normed token embedding, then the normed target hidden
        state. On CUDA two kernels write their halves of one buffer (no ``cat``): the embedding
        rows read and normed in one (``VocabParallelEmbedding.lookup_normed``), the hidden
        state's norm."""
        embed = self._shared[0]
        ne, nh = self.pre_fc_norm_embedding, self.pre_fc_norm_hidden
        if not use_triton(hidden):
            return torch.cat([ne(embed(input_ids)), nh(hidden)], dim=-1)
        from mtpserve.kernels.fused_triton import rms_norm

        H = hidden.shape[-1]
        out = hidden.new_empty(hidden.shape[0], 2 * H)
        embed.lookup_normed(input_ids, ne, out[:, :H])
        rms_norm(hidden, nh.weight, nh.eps, nh.zero_centered, out=out[:, H:])
        return out
