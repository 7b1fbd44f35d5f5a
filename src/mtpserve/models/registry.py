"""model_type -> model class."""

from __future__ import annotations

from torch import nn

from mtpserve.config import LLAMA_FAMILY, ModelConfig

# Hybrid Gated DeltaNet + gated attention decoders (models/qwen3_next.py).
QWEN3_NEXT_FAMILY = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


def model_class(cfg: ModelConfig) -> type[nn.Module]:
    """The class that serves ``cfg.model_type``.

    Raises:
        ValueError: for an architecture mtpserve does not implement.
    """
    if cfg.model_type in LLAMA_FAMILY:
        from mtpserve.models.llama import LlamaForCausalLM

        return LlamaForCausalLM
    if cfg.model_type in QWEN3_NEXT_FAMILY:
        from mtpserve.models.qwen3_next import Qwen3NextForCausalLM

        return Qwen3NextForCausalLM
    raise ValueError(f"unsupported model_type {cfg.model_type!r}; supported: "
                     f"{', '.join(LLAMA_FAMILY + QWEN3_NEXT_FAMILY)}")
