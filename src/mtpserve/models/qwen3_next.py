"""Hybrid decoder of Qwen3-Next (``qwen3_next``) and Qwen3.5 text (``qwen3_5_text``,
``qwen3_5_moe_text``): Gated DeltaNet layers mixed with gated full attention, MoE or dense FFNs.

Pre-norm decoder with zero-centred RMSNorm (``x * (1 + w)``): layer i mixes tokens with full
attention when ``layer_types[i] == "full_attention"`` (every ``full_attention_interval``-th layer)
and with Gated DeltaNet otherwise. Layer names follow vLLM / HF so checkpoints map line by line;
Qwen3.5's multimodal checkpoints (``model.language_model.*``, ``model.visual.*``) load their text
part. The MTP draft module (``mtp.*``, models/mtp.py) is built when the config has
``mtp_num_hidden_layers >= 1``.
"""

from __future__ import annotations

import logging
import re
from typing import Iterable, Iterator

import torch
from torch import nn

from mtpserve.config import ModelConfig
from mtpserve.engine.forward_batch import ForwardBatch
from mtpserve.kernels.dispatch import use_triton
from mtpserve.layers.attention import Attention
from mtpserve.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from mtpserve.layers.gated_attention import GatedAttention, rotary_dim
from mtpserve.layers.linear_attention import GatedDeltaNet
from mtpserve.layers.moe import SparseMoeBlock, build_mlp
from mtpserve.layers.norm import RMSNorm
from mtpserve.layers.rotary import RotaryEmbedding
from mtpserve.models.weights import STACKED_LLAMA, check_all_loaded, load_weights

logger = logging.getLogger(__name__)

# checkpoint fragments of the linear-attention projections -> sections of our fused in_proj
STACKED_HYBRID = STACKED_LLAMA + (
    (".in_proj.", ".in_proj_qkvz.", "qkvz"), (".in_proj.", ".in_proj_ba.", "ba"),  # Qwen3-Next
    (".in_proj.", ".in_proj_qkv.", (0, 1, 2)), (".in_proj.", ".in_proj_z.", 3),    # Qwen3.5
    (".in_proj.", ".in_proj_b.", 4), (".in_proj.", ".in_proj_a.", 5),
)
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


class HybridDecoderLayer(nn.Module):
    """``input_layernorm -> token mixer -> residual -> post_attention_layernorm -> FFN ->
    residual``; the mixer is ``linear_attn`` (GatedDeltaNet, state ``index``) or ``self_attn``
    (GatedAttention, KV cache ``index``). ``forward(rope, x [T, H], batch) -> [T, H]``.

    ``forward_residual(rope, h, residual, batch) -> (h', residual')`` is the same layer with the
    residual carried separately, so that each residual add runs inside the next norm
    (``RMSNorm.forward(x, residual)``; one kernel on CUDA): the input is ``residual + h``
    (``residual`` None: ``h``), the output ``residual' + h'``. On CUDA h' may be a sparse MoE
    block's per-choice outputs (``SplitKPartials``), which that norm sums.
    """

    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer_type: str, index: int,
                 mlp_layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=True)
        self.is_linear = layer_type == "linear_attention"
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(cfg, index)
        else:
            self.self_attn = GatedAttention(cfg, rotary, index)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps,
                                                zero_centered=True)
        self.mlp = build_mlp(cfg, mlp_layer_idx)
        self.sparse = isinstance(self.mlp, SparseMoeBlock)

    def forward(self, rope, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        h, residual = self.forward_residual(rope, x, None, batch)
        return residual + (h.total() if hasattr(h, "total") else h)

    def forward_residual(self, rope, h: torch.Tensor, residual: torch.Tensor | None,
                         batch: ForwardBatch, normed: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """``normed``: ``input_layernorm``'s output, already made by the caller (the first
        layer's, with the embedding: ``residual`` is then the layer's input)."""
        if normed is None:
            h, residual = self.input_layernorm.add_norm(h, residual)
        else:
            h = normed
        h = self.linear_attn(h, batch) if self.is_linear else self.self_attn(rope, h, batch)
        h, residual = self.post_attention_layernorm(h, residual)
        # a sparse MoE block may leave its per-choice outputs for the next norm to sum
        return (self.mlp(h, defer_sum=True) if self.sparse else self.mlp(h)), residual


def layer_types(cfg: ModelConfig) -> list[str]:
    """``linear_attention`` / ``full_attention`` per decoder layer (config ``layer_types``, else
    full attention every ``full_attention_interval``-th layer)."""
    hf = cfg.hf_config
    types = getattr(hf, "layer_types", None)
    if types:
        return list(types)
    every = getattr(hf, "full_attention_interval", 4)
    return ["full_attention" if (i + 1) % every == 0 else "linear_attention"
            for i in range(cfg.num_hidden_layers)]


class Qwen3NextModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_len: int):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = rotary = RotaryEmbedding(cfg.head_dim, rotary_dim(cfg), max_len,
                                               cfg.hf_config)
        counts = {"linear_attention": 0, "full_attention": 0}
        layers = []
        for i, kind in enumerate(layer_types(cfg)[: cfg.num_hidden_layers]):
            layers.append(HybridDecoderLayer(cfg, rotary, kind, counts[kind], i))
            counts[kind] += 1
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=True)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        h, residual, normed = self._embed(batch.input_ids)
        rope = self.rotary.lookup(batch.positions, h.dtype)
        for layer in self.layers:
            h, residual = layer.forward_residual(rope, h, residual, batch, normed)
            normed = None
        return self.norm.add_norm(h, residual)[0]

    def _embed(self, ids: torch.Tensor):
        """(h, residual, normed) for the first layer: the embedding [T, H]; on CUDA (one TP
        rank, layers to run) the embedding rows read once and the first layer's input norm
        made in the same kernel: (embedding, embedding, its norm)."""
        emb = self.embed_tokens
        if not (self.layers and emb.tp_size == 1 and use_triton(emb.weight)):
            return emb(ids), None, None
        raw = emb.weight.new_empty(ids.shape[0], emb.weight.shape[1])
        normed = emb.lookup_normed(ids, self.layers[0].input_layernorm, torch.empty_like(raw),
                                   raw_out=raw)
        return raw, raw, normed


class Qwen3NextForCausalLM(nn.Module):
    """Hybrid causal LM over the paged KV cache and the recurrent-state cache.

    ``forward(batch) -> hidden [T, H]`` (after the final norm; the MTP input);
    ``compute_logits(hidden [N, H]) -> [N, vocab] float32``. ``attention_layers()`` lists only the
    full-attention layers (``layer_idx`` = index into ``batch.kv_caches``);
    ``linear_attention_layers()`` the Gated DeltaNet layers (``state_idx`` into the StateCache).
    ``mtp`` is the MTP draft module (models/mtp.py) or None.
    """

    def __init__(self, cfg: ModelConfig, max_len: int):
        super().__init__()
        self.config = cfg
        self.model = Qwen3NextModel(cfg, max_len)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.mtp = None
        self.mtp_missing: list[str] = []   # names of the MTP tensors a checkpoint lacked
        if (getattr(cfg.hf_config, "mtp_num_hidden_layers", 0) or 0) >= 1:
            from mtpserve.models.mtp import Qwen3NextMTP

            self.mtp = Qwen3NextMTP(cfg, self.model.embed_tokens, self.model.rotary)

    def attention_layers(self) -> list[Attention]:
        return [l.self_attn.attn for l in self.model.layers if not l.is_linear]

    def linear_attention_layers(self) -> list[GatedDeltaNet]:
        return [l.linear_attn for l in self.model.layers if l.is_linear]

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.model(batch)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors (text part of Qwen3.5 multimodal checkpoints too).

        ``mtp.*`` tensors go into the MTP module when there is one (and are ignored otherwise);
        if the checkpoint has none at all, the MTP module is dropped with a warning.

        Raises:
            ValueError: for unknown tensors, shape mismatches, or missing tensors.
        """
        experts = _ExpertLoader(self)
        loaded = load_weights(self, experts.take(self._text_weights(weights)),
                              stacked=STACKED_HYBRID)
        loaded |= experts.finish()
        if self.config.tie_word_embeddings:
            loaded.add("lm_head.weight")
        if self.mtp is not None and not any(n.startswith("mtp.") for n in loaded):
            logger.warning("config asks for %d MTP layer(s) but the checkpoint has no mtp.* "
                           "tensors: MTP speculation is unavailable", len(self.mtp.layers))
            self.mtp_missing = [n for n, _ in self.mtp.named_parameters(prefix="mtp")]
            self.mtp = None
        check_all_loaded(self, loaded)

    def _text_weights(self, weights) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in weights:
            if name.startswith("model.language_model."):
                name = "model." + name[len("model.language_model."):]
            if name.startswith("model.visual.") or (self.mtp is None and name.startswith("mtp.")):
                continue
            if "rotary_emb.inv_freq" in name or (self.config.tie_word_embeddings
                                                 and name.startswith("lm_head.")):
                continue
            yield name, t


class _ExpertLoader:
    """Routes per-expert checkpoint tensors (``...experts.{e}.{gate,up,down}_proj.weight``) into
    the fused expert parameters and checks every expert was filled."""

    def __init__(self, model: nn.Module):
        self.params = dict(model.named_parameters())
        self.seen: dict[str, set] = {}

    def take(self, weights):
        for name, t in weights:
            m = _EXPERT.match(name)
            if m is None:
                yield name, t
                continue
            prefix, e, part = m.group(1), int(m.group(2)), m.group(3)
            target = f"{prefix}.{'down_proj' if part == 'down' else 'gate_up_proj'}"
            if target not in self.params:
                raise ValueError(f"checkpoint tensor {name!r} matches no model parameter")
            param = self.params[target]
            with torch.no_grad():
                param.weight_loader(param, t, (e, part))
            self.seen.setdefault(target, set()).add((e, part))

    def finish(self) -> set[str]:
        for target, got in self.seen.items():
            need = 1 if target.endswith("down_proj") else 2
            if len(got) != self.params[target].num_experts * need:
                raise ValueError(f"checkpoint has {len(got)} of the expert tensors of {target}")
        return set(self.seen)
