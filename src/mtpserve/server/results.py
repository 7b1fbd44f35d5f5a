"""Accumulated state of one API response: its choices, usage and speculative stats."""

from __future__ import annotations

from mtpserve.outputs import CompletionOutput, RequestOutput, SpecStats
from mtpserve.server.errors import APIError
from mtpserve.server.fanout import ChoiceRequest


class ResponseState:
    """Folds the deltas of all choices of one response.

    ``usage()`` counts each prompt once (as OpenAI does for ``n > 1``) and every returned token;
    ``cached_tokens`` is the prefix-cache hit of each prompt's first choice.
    """

    def __init__(self, reqs: list[ChoiceRequest], n: int):
        self.reqs = reqs
        self.n = n
        self.choices = [CompletionOutput(index=r.index) for r in reqs]
        self._cached: dict[int, int] = {}
        self._specs: dict[int, SpecStats] = {}

    def add(self, index: int, out: RequestOutput, engine_alive: bool = True) -> CompletionOutput:
        """Fold one delta into choice ``index`` and return it.

        Raises:
            APIError: the engine rejected or dropped the request (``out.error``): 400 when the
                engine is still running, else 503.
        """
        if out.error is not None:
            if engine_alive:
                raise APIError(400, f"request rejected by the engine: {out.error}")
            raise engine_unavailable(out.error)
        choice = self.choices[index]
        choice.add(out)
        self._cached[index] = out.num_cached_tokens
        if out.spec is not None:
            self._specs[index] = out.spec
        return choice

    def usage(self) -> dict:
        prompt = sum(len(r.prompt_token_ids) for r in self.reqs if r.index % self.n == 0)
        cached = sum(self._cached.get(r.index, 0) for r in self.reqs if r.index % self.n == 0)
        completion = sum(len(c.token_ids) for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def extension(self) -> dict | None:
        """``{"spec": {...}}`` summed over choices, or None when no choice has spec stats."""
        if not self._specs:
            return None
        total = SpecStats(
            num_draft_tokens=sum(s.num_draft_tokens for s in self._specs.values()),
            num_accepted_tokens=sum(s.num_accepted_tokens for s in self._specs.values()),
            num_verify_steps=sum(s.num_verify_steps for s in self._specs.values()))
        return {"spec": {"num_draft_tokens": total.num_draft_tokens,
                         "num_accepted_tokens": total.num_accepted_tokens,
                         "num_verify_steps": total.num_verify_steps,
                         "acceptance_length": total.acceptance_length}}


def engine_unavailable(detail: str | None = None) -> APIError:
    """A 503 for a request the engine cannot serve (not ready, stopped or dead)."""
    msg = "the engine is not running" + (f": {detail}" if detail else "")
    return APIError(503, msg, type="service_unavailable", code="engine_unavailable")
