"""Model loading: GGUF (dequantized, cached as safetensors) and HF safetensors directories.

Public API: ``ModelFiles``, ``load_model_files``, ``default_model_path``.

The names are imported on first use (PEP 562), so that importing a light submodule such as
``mtpserve.loader.default_model`` (the HTTP side does) does not import transformers, gguf or torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .default_model import default_model_path
    from .load import load_model_files
    from .model_files import ModelFiles

__all__ = ["ModelFiles", "default_model_path", "load_model_files"]

_HOMES = {"ModelFiles": ".model_files", "default_model_path": ".default_model",
          "load_model_files": ".load"}


def __getattr__(name: str):
    """Import ``ModelFiles`` / ``load_model_files`` / ``default_model_path`` on first access."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
