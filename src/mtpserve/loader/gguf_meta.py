"""Open a GGUF file and read its metadata as a plain dict (big tokenizer arrays left out)."""

from __future__ import annotations

from typing import Any

import gguf

# Arrays of one entry per token (or merge): read only their length, as "<key>.count".
_BIG_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
               "tokenizer.ggml.scores")


def open_gguf(path: str) -> gguf.GGUFReader:
    """Memory-map ``path`` with ``gguf.GGUFReader`` (parses every metadata field: ~5 s for SmolLM2).

    Raises:
        ValueError: when the file is not a readable GGUF (names the path).
    """
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError) as e:  # bad magic / truncated file
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from e


def gguf_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """GGUF key -> Python value (int, float, str, bool or list); big token arrays give ``<key>.count``."""
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key in _BIG_ARRAYS:
            meta[key + ".count"] = len(field.data)
        else:
            meta[key] = field.contents()
    return meta
