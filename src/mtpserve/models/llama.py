"""Llama-family decoder: Llama, Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm), SmolLM2 (tied).

Pre-norm decoder (Touvron et al. 2023): RMSNorm -> GQA attention with RoPE -> residual ->
RMSNorm -> SwiGLU MLP -> residual. Layer names follow vLLM so a checkpoint maps line by line.
On CUDA each residual add runs inside the next norm's kernel, and q/k norms, RoPE and the K/V
cache write are one kernel (kernels/fused_triton.py); at one row (batch-1 decode) a streamed
product takes the residual add + norm in front of it, and the down product SiLU-and-mul, in its
own programs (kernels/gemv_stream_triton.py). The CPU path does the same ops unfused.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from mtpserve.config import ModelConfig
from mtpserve.engine.forward_batch import ForwardBatch
from mtpserve.kernels.dispatch import use_gemv, use_triton
from mtpserve.layers.activation import SiluAndMul, interleave_gate_up, silu_and_mul_interleaved
from mtpserve.layers.attention import Attention
from mtpserve.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from mtpserve.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from mtpserve.layers.norm import RMSNorm
from mtpserve.layers.rotary import RotaryEmbedding
from mtpserve.models.weights import check_all_loaded, load_weights


class LlamaAttention(nn.Module):
    """Self-attention block: fused QKV projection, optional per-head q/k RMSNorm, RoPE, output."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer_idx: int):
        super().__init__()
        hf = cfg.hf_config
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, bias=cfg.attention_bias)
        o_bias = cfg.attention_bias and cfg.model_type != "qwen2"
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size,
                                        bias=o_bias)
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.head_dim = cfg.head_dim
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.rotary = rotary
        scale = getattr(hf, "query_pre_attn_scalar", None)
        self.attn = Attention(self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, cfg.head_dim,
                              (scale or cfg.head_dim) ** -0.5, layer_idx)

    def forward(self, rope, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """``x`` [T, hidden] (normed; or a ``NormInput`` whose norm the q/k/v product does) ->
        [T, hidden]; ``rope`` from ``RotaryEmbedding.lookup``. Writes this step's K/V into the
        layer's cache in ``batch``."""
        qkv = self.qkv_proj(x)
        if use_triton(qkv):
            out = self.attn.attend(self._fused_qk_rope_kv(qkv, rope[2], batch), batch)
        else:
            out = self._qk_rope_attend(qkv, rope, batch)
        # a split product's partials go to the next norm, which sums them (layers/linear.py)
        return self.o_proj(out, defer_sum=True)

    def _qk_rope_attend(self, qkv: torch.Tensor, rope, batch: ForwardBatch) -> torch.Tensor:
        """The reference (CPU) path: q/k norms, RoPE, then ``Attention`` writes K/V and attends."""
        T, nq = qkv.shape[0], self.attn.num_heads
        qk = qkv[:, : self.q_size + self.kv_size].view(T, -1, self.head_dim)
        if hasattr(self, "q_norm"):
            qk = torch.cat([self.q_norm(qk[:, :nq]), self.k_norm(qk[:, nq:])], dim=1)
        qk = self.rotary.apply(qk, rope)   # queries and keys rotated together
        v = qkv[:, self.q_size + self.kv_size:]
        return self.attn(qk[:, :nq], qk[:, nq:], v, batch)

    def _fused_qk_rope_kv(self, qkv: torch.Tensor, positions: torch.Tensor,
                          batch: ForwardBatch) -> torch.Tensor:
        """CUDA: q/k norms + RoPE + K/V cache write in one Triton kernel; returns q [T, Hq, D]."""
        from mtpserve.kernels import fused_triton

        k_cache, v_cache = self.attn.kv_cache(batch)
        return fused_triton.qk_norm_rope_kv_write(
            qkv, self.attn.num_heads, self.attn.num_kv_heads, self.head_dim, positions,
            self.rotary.cos, self.rotary.signed_sin, k_cache, v_cache, batch.slot_mapping,
            **self._qk_norms())

    def _qk_norms(self) -> dict:
        """Qwen3's q/k RMSNorm operands (none for models without them)."""
        if not hasattr(self, "q_norm"):
            return {}
        return dict(q_weight=self.q_norm.weight, k_weight=self.k_norm.weight,
                    eps=self.q_norm.eps, zero_centered=self.q_norm.zero_centered)


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)).

    On CUDA, where it pays (``gemv_triton.swiglu_fits``), :meth:`process_weights_after_loading`
    interleaves the gate/up weight rows (gate j, up j), so that a product of a few rows applies
    SiLU-and-mul in its epilogue (``gemv(swiglu=True)``, kernels/gemv_triton.py) and reads one
    weight stream; the outputs are the same bits as with the checkpoint's order."""

    # the gate_up_proj rows (and bias) are in interleaved order (:func:`interleave_gate_up`)
    gate_up_interleaved = False

    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate] * 2, bias=bias)
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=bias)
        self.act = SiluAndMul()

    def forward(self, x):
        """[T, hidden] (or a ``NormInput``, ``RMSNorm.add_norm_into``) -> [T, hidden], or the
        down product's split-K partials for the next norm to sum
        (``RowParallelLinear(defer_sum=True)``). Where the streamed down product can take
        SiLU-and-mul in its own programs (one row, ``gemv_triton.fused_input_fits``), it gets
        the gate/up product as it is."""
        if self.gate_up_interleaved:
            return self.down_proj(self._swiglu(x), defer_sum=True)
        gu = self.gate_up_proj(x)
        if isinstance(gu, torch.Tensor) and use_triton(gu):
            from mtpserve.kernels.gemv_triton import fused_input_fits

            if fused_input_fits(gu, self.down_proj.weight, norm=False):
                return self.down_proj(gu, silu_input=True)
        return self.down_proj(self.act(gu), defer_sum=True)

    def _swiglu(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate(x)) * up(x)`` [T, intermediate / tp] over the interleaved weight: the
        skinny product with the SwiGLU epilogue where it applies, else the product then the
        interleaved SiLU-and-mul (prefill, a split reduction, SWIGLU_EPILOGUE off)."""
        gu = self.gate_up_proj   # interleaved only without a bias (the hook below)
        if not isinstance(x, torch.Tensor):   # a NormInput: norm and product in one kernel
            from mtpserve.kernels import gemv_triton

            return gemv_triton.gemv_fused_input(x, gu.weight, swiglu=True)
        if use_gemv(x, gu.weight):
            from mtpserve.kernels import gemv_triton

            if gemv_triton.swiglu_fits(gu.weight):
                return gemv_triton.gemv(x, gu.weight, swiglu=True)
        return silu_and_mul_interleaved(gu(x))

    def process_weights_after_loading(self) -> None:
        """After the checkpoint is loaded (engine/model_runner.py), where the Triton kernels run
        (CUDA), where the SwiGLU epilogue pays (``gemv_triton.swiglu_fits``: every even, unsplit
        gate/up weight since session 28; SWIGLU_MIN_K 4096 keeps the 1.7B's in the checkpoint's
        order, as before): reorder this rank's gate/up
        rows in place so that row 2j is gate row j and row 2j + 1 up row j (one temporary copy
        of the layer's weight). Only a bias-free weight that a one-row product would send to the
        skinny kernel qualifies (``use_gemv``: 16-bit, CUDA with Triton, ``gemv_triton.ENABLED``):
        the epilogue never runs on others. Idempotent; :meth:`LlamaForCausalLM.load_weights`
        refuses to load after it."""
        gu = self.gate_up_proj
        if (self.gate_up_interleaved or gu.bias is not None
                or not use_gemv(gu.weight[:1], gu.weight)):
            return
        from mtpserve.kernels import gemv_triton

        if not gemv_triton.swiglu_fits(gu.weight):
            return
        gu.weight.data.copy_(interleave_gate_up(gu.weight.data))
        self.gate_up_interleaved = True


class LlamaDecoderLayer(nn.Module):
    """One pre-norm decoder layer with the residual carried separately (so that each residual
    add is fused into the norm after it, ``RMSNorm.forward(x, residual)``).

    ``forward(rope, h, residual, batch) -> (h', residual')``, all [T, hidden] in the model dtype:
    the layer's input is ``residual + h`` (``residual`` None: the input is ``h`` itself, the
    first layer); its output is ``residual' + h'`` (h' the MLP output, not yet added; on CUDA
    possibly the down product's split-K partials, which the next norm sums).
    """

    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, rotary, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg.hidden_size, cfg.intermediate_size,
                            bool(getattr(cfg.hf_config, "mlp_bias", False)))

    def forward(self, rope, h: torch.Tensor, residual: torch.Tensor | None,
                batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        # at one row on CUDA a residual add + norm may run inside the product after it
        # (RMSNorm.add_norm_into): h is then a NormInput, the residual written by that product
        h, residual = self.input_layernorm.add_norm_into(h, residual,
                                                         self.self_attn.qkv_proj.weight)
        h = self.self_attn(rope, h, batch)
        h, residual = self.post_attention_layernorm.add_norm_into(h, residual,
                                                                  self.mlp.gate_up_proj.weight)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_len: int):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = rotary = RotaryEmbedding(cfg.head_dim, cfg.head_dim, max_len, cfg.hf_config)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, rotary, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        h = self.embed_tokens(batch.input_ids)
        rope = self.rotary.lookup(batch.positions, h.dtype)
        residual = None
        for layer in self.layers:
            h, residual = layer(rope, h, residual, batch)
        return self.norm.add_norm(h, residual)[0]


class LlamaForCausalLM(nn.Module):
    """Causal LM over the paged KV cache.

    ``forward(batch) -> hidden [T, hidden]`` (after the final norm; also the MTP / draft input);
    ``compute_logits(hidden [N, hidden]) -> [N, vocab] float32``.
    """

    def __init__(self, cfg: ModelConfig, max_len: int):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, max_len)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.model(batch)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors; raises ``ValueError`` for unknown or missing ones, or once the
        gate/up rows were interleaved (``LlamaMLP.process_weights_after_loading``): a
        checkpoint's rows would land in the other order."""
        if any(layer.mlp.gate_up_interleaved for layer in self.model.layers):
            raise ValueError("load_weights after process_weights_after_loading: the gate/up "
                             "rows are interleaved")
        skip = ("rotary_emb.inv_freq",) + (("lm_head.",) if self.config.tie_word_embeddings else ())
        loaded = load_weights(self, weights, skip=skip)
        if self.config.tie_word_embeddings:
            loaded.add("lm_head.weight")
        check_all_loaded(self, loaded)
