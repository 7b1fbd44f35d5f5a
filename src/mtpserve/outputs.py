"""What the engine hands back: per-step deltas and the accumulated completion."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    """Log-probability of one emitted token under the target model.

    ``logprob`` is ``log_softmax`` of the target's raw logits (before temperature, penalties and
    top-k/p), in nats. ``top`` holds the ``k`` most likely ``(token_id, logprob)`` pairs, best first.
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class SpecStats:
    """Speculative-decoding counters for one request.

    ``num_draft_tokens``: draft tokens proposed and verified; ``num_accepted_tokens``: of those,
    how many the target accepted; ``num_verify_steps``: target forward passes that checked drafts
    (steps with zero drafts excluded). Acceptance length = tokens emitted per verify step, bonus
    token included = (accepted + steps) / steps.
    """

    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_verify_steps: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def acceptance_length(self) -> float | None:
        if not self.num_verify_steps:
            return None
        return (self.num_accepted_tokens + self.num_verify_steps) / self.num_verify_steps


@dataclass
class RequestOutput:
    """One step's news for one request (a delta: only what is new since the last output).

    ``new_token_ids`` / ``new_logprobs`` are the tokens emitted this step (several when a
    speculative block was accepted); ``new_text`` is the newly *releasable* text: stop strings are
    held back until they can no longer match, and never released once matched. When ``finished``,
    ``finish_reason`` is ``"stop"`` (EOS, stop token or stop string), ``"length"`` (max_tokens or
    max_model_len) or ``"abort"``; ``stop_reason`` is the matched stop string or token id (None for
    EOS and length). Counters are cumulative.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[TokenLogprob] | None
    finished: bool
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    spec: SpecStats | None = None
    error: str | None = None

    @classmethod
    def aborted(cls, request_id: str, error: str | None = None) -> "RequestOutput":
        """The last delta of a request ended by the server (abort, refusal, dead engine)."""
        return cls(request_id, [], "", None, True, "abort", error=error)


@dataclass
class CompletionOutput:
    """A finished (or accumulated-so-far) completion, as the offline ``LLM`` API returns it."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    spec: SpecStats | None = None

    def add(self, out: RequestOutput) -> None:
        """Fold one delta into this completion."""
        self.text += out.new_text
        self.token_ids.extend(out.new_token_ids)
        if out.new_logprobs is not None:
            self.logprobs = (self.logprobs or []) + out.new_logprobs
        if out.finished:
            self.finish_reason, self.stop_reason = out.finish_reason, out.stop_reason
        self.spec = out.spec


@dataclass
class GenerateResult:
    """All ``n`` completions of one prompt, from ``LLM.generate``."""

    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
