"""Model loading: GGUF (dequantized, cached as safetensors) and HF safetensors directories.

Public API: ``ModelFiles``, ``load_model_files``, ``default_model_path``.
"""

from .default_model import default_model_path
from .load import load_model_files
from .model_files import ModelFiles

__all__ = ["ModelFiles", "default_model_path", "load_model_files"]
