"""Per-request generation settings (the OpenAI / vLLM sampling parameters)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Temperatures below this are treated as greedy (argmax), as vLLM does.
GREEDY_EPS = 1e-5


@dataclass
class SamplingParams:
    """How one request's tokens are chosen and when generation stops.

    Fields follow vLLM's ``SamplingParams`` so that users can carry settings over:

    - ``n``: number of independent completions for the prompt (>= 1).
    - ``max_tokens``: most tokens to generate; ``None`` means up to ``max_model_len``.
    - ``min_tokens``: EOS and ``stop_token_ids`` are ignored before this many tokens.
    - ``temperature``: 0 means greedy (argmax); > 0 scales logits by ``1 / temperature``.
    - ``top_p`` in (0, 1], ``top_k`` (0 or -1: off), ``min_p`` in [0, 1].
    - ``repetition_penalty`` (> 0, 1 = off; HF/CTRL style, over prompt and output tokens),
      ``presence_penalty`` / ``frequency_penalty`` in [-2, 2] (OpenAI style, output tokens only).
    - ``logit_bias``: token id -> additive bias, clamped to [-100, 100] like OpenAI.
    - ``seed``: per-request seed; the same seed and the same prompt give the same output.
    - ``stop``: strings that end generation (not included in the text unless
      ``include_stop_str_in_output``); ``stop_token_ids``: token ids that end generation.
    - ``ignore_eos``: keep generating past EOS.
    - ``logprobs``: ``None`` for none; ``k >= 0`` returns the sampled token's logprob and the top k.
    - ``prompt_logprobs``: unused for now (kept for API parity; must be ``None``).
    - ``skip_special_tokens``: leave special tokens out of the detokenized text.

    Raises:
        ValueError: from :meth:`validate`, with a message naming the bad field.
    """

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def greedy(self) -> bool:
        """True when the argmax is taken (temperature 0)."""
        return self.temperature < GREEDY_EPS

    @property
    def needs_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def validate(self, vocab_size: int | None = None) -> None:
        """Check every field; raise ``ValueError`` naming the first bad one."""
        _check(isinstance(self.n, int) and self.n >= 1, "n", f"n must be at least 1, got {self.n}")
        if self.max_tokens is not None:
            _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens",
                   f"max_tokens must be at least 1, got {self.max_tokens}")
        _check(self.min_tokens >= 0, "min_tokens", f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens",
                   f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        _check(_finite(self.temperature) and self.temperature >= 0, "temperature",
               f"temperature must be >= 0, got {self.temperature}")
        _check(_finite(self.top_p) and 0 < self.top_p <= 1, "top_p",
               f"top_p must be in (0, 1], got {self.top_p}")
        _check(isinstance(self.top_k, int) and (self.top_k >= 0 or self.top_k == -1), "top_k",
               f"top_k must be -1 (off), 0 (off) or positive, got {self.top_k}")
        _check(_finite(self.min_p) and 0 <= self.min_p <= 1, "min_p",
               f"min_p must be in [0, 1], got {self.min_p}")
        _check(_finite(self.repetition_penalty) and self.repetition_penalty > 0, "repetition_penalty",
               f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _check(_finite(v) and -2 <= v <= 2, name, f"{name} must be in [-2, 2], got {v}")
        if self.logprobs is not None:
            _check(isinstance(self.logprobs, int) and 0 <= self.logprobs <= 20, "logprobs",
                   f"logprobs must be in [0, 20], got {self.logprobs}")
        _check(self.prompt_logprobs is None, "prompt_logprobs", "prompt_logprobs is not supported")
        _check(self.seed is None or (isinstance(self.seed, int) and -2**63 <= self.seed < 2**63),
               "seed", f"seed must be an integer in [-2^63, 2^63), got {self.seed}")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop",
               "stop must be a list of non-empty strings")
        self._validate_token_ids(vocab_size)

    def _validate_token_ids(self, vocab_size: int | None) -> None:
        ids = list(self.stop_token_ids) + list((self.logit_bias or {}).keys())
        for t in ids:
            ok = isinstance(t, int) and t >= 0 and (vocab_size is None or t < vocab_size)
            _check(ok, "stop_token_ids" if t in self.stop_token_ids else "logit_bias",
                   f"token id {t} is outside the vocabulary [0, {vocab_size})")
        for t, b in (self.logit_bias or {}).items():
            _check(_finite(b), "logit_bias", f"logit_bias for token {t} must be a finite number")


class SamplingParamsError(ValueError):
    """A bad sampling parameter; ``param`` names the field (OpenAI error ``param``)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise SamplingParamsError(param, message)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
