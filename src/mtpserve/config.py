"""Typed, frozen configuration: the model's shape and the engine's settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a device or dtype is asked for: `import mtpserve`,
    import torch   # the CLI's argument parsing and the HTTP side do not need it

# Architectures served by the Llama-family decoder (models/llama.py).
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "smollm2")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder-only transformer, read from a transformers ``PretrainedConfig``.

    All sizes are counts (not bytes). ``head_dim`` is per attention head; ``eos_token_ids`` are the
    ids that end generation unless ``ignore_eos``. ``hf_config`` keeps the full transformers config
    for model-specific fields (rope scaling, hybrid layer types, MoE sizes).
    """

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]
    hf_config: Any = field(compare=False, repr=False, default=None)

    @classmethod
    def from_hf(cls, hf: Any) -> "ModelConfig":
        """Build from a transformers config (``qwen3_5*`` read their ``text_config``).

        Raises:
            ValueError: when a required size is missing from the config.
        """
        text = getattr(hf, "text_config", None) or hf
        mt = text.model_type
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        eos = getattr(hf, "eos_token_id", None)
        if eos is None:
            eos = getattr(text, "eos_token_id", None)
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        return cls(
            model_type=mt,
            hidden_size=text.hidden_size,
            intermediate_size=getattr(text, "intermediate_size", 0) or 0,
            num_hidden_layers=text.num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            vocab_size=text.vocab_size,
            rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
            max_position_embeddings=getattr(text, "max_position_embeddings", 2048),
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)
                                     or getattr(text, "tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; others say so in the config.
            attention_bias=mt == "qwen2" or bool(getattr(text, "attention_bias", False)),
            qk_norm=mt in ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"),
            eos_token_ids=eos_ids,
            hf_config=text,
        )


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding settings (SGLang flag names).

    ``algorithm``: ``ngram`` | ``draft`` | ``nextn`` (alias ``mtp``) | the test proposers
    ``forced_accept`` / ``forced_reject``. ``num_steps`` is k, the most draft tokens per request and
    step; ``num_draft_tokens`` is the tokens verified per step (k + 1 for a chain). ``adaptive``:
    each request drafts only as many tokens as its own acceptance makes worthwhile
    (spec/policy.py); off, every request drafts k whenever it can (the test proposers never adapt).
    ``token_map``: a ``.pt`` / ``.json`` file of "hot" token ids that the MTP draft's LM head is
    restricted to (FR-Spec, spec/draft_head.py); read and checked at engine start
    (spec/token_map.py). None: the full vocabulary. ``draft_head_quantization``: "fp8" takes
    greedy MTP drafts through an FP8 copy of that head (spec/draft_head.py ``Fp8GreedyHead``);
    None: the head's own dtype.
    """

    algorithm: str
    num_steps: int = 3
    num_draft_tokens: int | None = None
    ngram_min: int = 1
    ngram_max: int = 4
    draft_model_path: str | None = None
    adaptive: bool = True
    token_map: str | None = None
    draft_head_quantization: str | None = None

    ALGORITHMS = ("ngram", "draft", "nextn", "mtp", "forced_accept", "forced_reject")

    def __post_init__(self) -> None:
        """Raises ``ValueError`` naming the flag for settings that cannot work together."""
        if self.algorithm not in self.ALGORITHMS:
            raise ValueError(f"--speculative-algorithm must be one of {', '.join(self.ALGORITHMS)}"
                             f", got {self.algorithm!r}")
        if not 1 <= self.num_steps <= 16:
            raise ValueError(f"--speculative-num-steps must be in [1, 16], got {self.num_steps}")
        if self.num_draft_tokens is not None and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError(f"--speculative-num-draft-tokens must be --speculative-num-steps + 1 "
                             f"= {self.num_steps + 1} (chain drafting; trees are not supported), "
                             f"got {self.num_draft_tokens}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= --speculative-ngram-min ({self.ngram_min}) <= "
                             f"--speculative-ngram-max ({self.ngram_max})")
        if self.algorithm == "draft" and not self.draft_model_path:
            raise ValueError("--speculative-algorithm draft needs --speculative-draft-model-path "
                             "(a model with the same tokenizer, or 'self')")
        if self.token_map is not None and self.algorithm not in ("nextn", "mtp"):
            why = " (n-gram drafts have no LM head)" if self.algorithm == "ngram" else ""
            raise ValueError(f"--speculative-token-map restricts the LM head of MTP drafts: it "
                             f"needs --speculative-algorithm nextn or mtp, got "
                             f"{self.algorithm!r}{why}")
        if self.draft_head_quantization not in (None, "fp8"):
            raise ValueError(f"--speculative-draft-head-quantization must be fp8, got "
                             f"{self.draft_head_quantization!r}")
        if self.draft_head_quantization and self.algorithm not in ("nextn", "mtp"):
            raise ValueError(f"--speculative-draft-head-quantization quantizes the LM head of MTP "
                             f"drafts: it needs --speculative-algorithm nextn or mtp, got "
                             f"{self.algorithm!r}")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to start.

    - ``model``: HF directory, GGUF file, or ``None`` for the default SmolLM2-135M-Instruct GGUF.
    - ``dtype``: ``auto`` (float32 on CPU, bfloat16 on CUDA) | ``float32`` | ``bfloat16`` | ``float16``.
    - ``max_model_len``: tokens per sequence, prompt + output (default: the model's).
    - ``block_size``: tokens per KV-cache block.
    - ``kv_cache_memory_bytes``: KV pool size on CPU (default 1 GiB); ``num_kv_blocks`` overrides.
    - ``max_num_seqs``: most requests in one step; ``max_num_batched_tokens``: token budget per step
      (long prefills are chunked to fit).
    - ``async_scheduling``: prepare each step while the previous one runs (engine/overlap.py);
      None = on for CUDA devices.
    """

    model: str | None = None
    tokenizer: str | None = None
    served_model_name: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_memory_bytes: int | None = None
    num_kv_blocks: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    seed: int = 0
    speculative: SpeculativeConfig | None = None
    enforce_eager: bool = False
    cuda_graph_max_tokens: int | None = None
    gpu_memory_utilization: float = 0.9
    async_scheduling: bool | None = None

    def torch_device(self) -> torch.device:
        """The device to run on; ``auto`` is ``cuda`` when CUDA is available, else ``cpu``."""
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self) -> torch.dtype:
        """The weight / activation dtype; ``auto`` is float32 on CPU and bfloat16 on CUDA."""
        import torch

        if self.dtype == "auto":
            return torch.float32 if self.torch_device().type == "cpu" else torch.bfloat16
        try:
            return {"float32": torch.float32, "bfloat16": torch.bfloat16,
                    "float16": torch.float16}[self.dtype]
        except KeyError:
            raise ValueError(f"unknown dtype {self.dtype!r}; use auto, float32, bfloat16 or float16")
