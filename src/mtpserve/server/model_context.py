"""What the HTTP layer needs to know about the served model, read from the running engine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpserve.engine.async_engine import AsyncEngine
from mtpserve.server.errors import APIError

from mtpserve.loader.default_model import DEFAULT_GGUF_NAME


def default_model_name(model: str | None) -> str:
    """Served name derived from a model path: a file's stem, a directory's name.

    ``/m/SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``SmolLM2-135M-Instruct.Q4_1``;
    ``/m/Qwen3-0.6B/`` -> ``Qwen3-0.6B``; ``None`` (the default model) -> its GGUF stem.
    """
    if not model:
        return Path(DEFAULT_GGUF_NAME).stem
    p = Path(model)
    return p.stem if p.suffix.lower() in (".gguf", ".safetensors", ".bin") else p.name


@dataclass(frozen=True)
class ModelContext:
    """The served model's name, tokenizer and limits.

    ``max_model_len``: tokens per sequence (prompt + completion); ``vocab_size``: valid token ids
    are ``0 <= id < vocab_size``.
    """

    name: str
    tokenizer: Any
    max_model_len: int
    vocab_size: int


def model_context(engine: AsyncEngine, served_model_name: str | None) -> ModelContext:
    """Read the context from a ready engine.

    Raises:
        APIError: 503 when the engine is not built yet.
    """
    eng = engine.engine
    if eng is None:
        raise APIError(503, "the engine is not ready", type="service_unavailable",
                       code="engine_not_ready")
    cfg = getattr(eng, "config", None)
    name = (served_model_name or getattr(cfg, "served_model_name", None)
            or default_model_name(getattr(cfg, "model", None)))
    return ModelContext(name=name, tokenizer=eng.tokenizer, max_model_len=int(eng.max_model_len),
                        vocab_size=int(eng.model_config.vocab_size))
