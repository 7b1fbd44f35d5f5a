"""model_type -> model class."""

from __future__ import annotations

from torch import nn

from mtpserve.config import LLAMA_FAMILY, ModelConfig


def model_class(cfg: ModelConfig) -> type[nn.Module]:
    """The class that serves ``cfg.model_type``.

    Raises:
        ValueError: for an architecture mtpserve does not implement.
    """
    if cfg.model_type in LLAMA_FAMILY:
        from mtpserve.models.llama import LlamaForCausalLM

        return LlamaForCausalLM
    raise ValueError(f"unsupported model_type {cfg.model_type!r}; supported: "
                     f"{', '.join(LLAMA_FAMILY)}")
