"""load_model_files: resolve a model argument (None, .gguf file, HF directory) and load it.

The GGUF loader (gguf, numpy) is imported only when a GGUF is loaded, and transformers only when
a checkpoint is read, not when this module is imported.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .default_model import default_model_path
from .hf_loader import INDEX_FILE, SINGLE_FILE, load_hf_dir

if TYPE_CHECKING:
    from .model_files import ModelFiles


def _load_gguf(path: str, tokenizer: str | None) -> ModelFiles:
    from .gguf_loader import load_gguf

    return load_gguf(path, tokenizer)


def _load_dir(folder: str, tokenizer: str | None) -> ModelFiles:
    has_config = os.path.isfile(os.path.join(folder, "config.json"))
    has_weights = any(os.path.isfile(os.path.join(folder, n)) for n in (SINGLE_FILE, INDEX_FILE))
    if has_config and has_weights:
        return load_hf_dir(folder, tokenizer)
    ggufs = sorted(n for n in os.listdir(folder) if n.endswith(".gguf"))
    if len(ggufs) == 1:
        return _load_gguf(os.path.join(folder, ggufs[0]), tokenizer)
    if len(ggufs) > 1:
        raise ValueError(f"{folder}: holds several .gguf files {ggufs}; pass one file")
    if has_config:
        return load_hf_dir(folder, tokenizer)  # raises FileNotFoundError naming the missing weights
    raise FileNotFoundError(f"{folder}: no config.json (HF checkpoint) and no .gguf file")


def load_model_files(model: str | None, tokenizer: str | None = None) -> ModelFiles:
    """Load a checkpoint's config, tokenizer and weight stream.

    ``model``: None (the default SmolLM2-135M-Instruct GGUF, see ``default_model_path``), a
    ``.gguf`` file, an HF directory (``config.json`` + ``model.safetensors`` or a sharded
    ``model.safetensors.index.json``), or a directory holding exactly one ``.gguf``.
    ``tokenizer``: optional separate tokenizer (HF directory or ``.gguf``).

    Raises:
        FileNotFoundError: no such path; a directory without config.json or weights; a missing
            shard or tokenizer; the default model not installed.
        ValueError: a file that is not .gguf; several .gguf in a directory; an unsupported GGUF
            architecture, rope scaling or tensor.
    """
    path = default_model_path() if model is None else os.path.expanduser(model)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model path {path!r} does not exist")
    if tokenizer is not None and not os.path.exists(tokenizer):
        raise FileNotFoundError(f"tokenizer path {tokenizer!r} does not exist")
    if os.path.isdir(path):
        return _load_dir(os.path.abspath(path), tokenizer)
    if not path.endswith(".gguf"):
        raise ValueError(f"{path}: a model file must be .gguf (or pass an HF directory)")
    return _load_gguf(path, tokenizer)
