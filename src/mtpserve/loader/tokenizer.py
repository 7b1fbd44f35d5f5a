"""Tokenizers: HF tokenizer directories, and GGUF-embedded tokenizers with their chat template."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # transformers (and gguf, for GGUF files) are imported when a tokenizer loads
    from transformers import PreTrainedTokenizerBase

# Any of these marks a directory as holding a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def has_tokenizer_files(folder: str) -> bool:
    """True when ``folder`` holds at least one of ``TOKENIZER_FILES``."""
    return any(os.path.isfile(os.path.join(folder, n)) for n in TOKENIZER_FILES)


def apply_gguf_metadata(tok: PreTrainedTokenizerBase, meta: Mapping[str, Any]) -> None:
    """Make ``tok`` agree with the GGUF: chat template from ``tokenizer.chat_template``, and the
    eos / bos tokens from ``tokenizer.ggml.eos_token_id`` / ``bos_token_id`` (ids into the vocab)."""
    template = meta.get("tokenizer.chat_template")
    if template and not tok.chat_template:
        tok.chat_template = template
    for role in ("eos", "bos"):
        want = meta.get(f"tokenizer.ggml.{role}_token_id")
        if want is not None and getattr(tok, f"{role}_token_id") != want:
            setattr(tok, f"{role}_token", tok.convert_ids_to_tokens(int(want)))


def tokenizer_from_gguf(path: str, meta: Mapping[str, Any]) -> PreTrainedTokenizerBase:
    """The fast tokenizer that transformers builds from a GGUF's vocab and merges (~7 s for SmolLM2),
    with ``apply_gguf_metadata`` applied. ``meta`` is the file's ``gguf_metadata``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path))
    apply_gguf_metadata(tok, meta)
    return tok


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """A tokenizer from an HF directory or from a ``.gguf`` file (not cached: slow for GGUF).

    Raises:
        FileNotFoundError: when ``path`` does not exist or a directory holds no tokenizer files.
    """
    if os.path.isfile(path) and path.endswith(".gguf"):
        from .gguf_meta import gguf_metadata, open_gguf

        return tokenizer_from_gguf(path, gguf_metadata(open_gguf(path)))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer path {path!r} is neither a directory nor a .gguf file")
    if not has_tokenizer_files(path):
        raise FileNotFoundError(f"{path}: no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); "
                                f"pass a tokenizer path")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
