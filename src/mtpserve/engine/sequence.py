"""One request's state inside the engine: tokens, KV blocks, progress, stop conditions."""

from __future__ import annotations

import enum
import time

import torch

from mtpserve.outputs import RequestOutput, SpecStats, TokenLogprob
from mtpserve.sampling_params import SamplingParams


# Stands in the token list for a token still being sampled on the device; the step that reads it
# takes the real id from the device instead (engine/overlap.py), so no forward ever embeds it.
PLACEHOLDER_TOKEN = 0


class SequenceStatus(enum.Enum):
    WAITING = "waiting"      # not yet (or no longer, after preemption) holding KV blocks
    RUNNING = "running"      # scheduled; may still be in the middle of a chunked prefill
    FINISHED = "finished"


class Sequence:
    """A request being served.

    ``token_ids`` = prompt + accepted output tokens. ``num_computed_tokens`` of them have K/V in
    the cache (the newest token never has: it is the next step's input). ``draft_token_ids`` are
    this step's speculative tokens; they are verified and then dropped or turned into output.

    Stop conditions are checked on every appended token (also in the middle of an accepted
    speculative block): EOS (unless ``ignore_eos``), ``stop_token_ids``, stop strings (through the
    detokenizer), ``max_tokens`` and ``max_model_len``. A request without stop strings feeds its
    tokens to the detokenizer only when its output is taken (:meth:`take_output`): the text is
    the same, and the decoding falls where the engine takes outputs, which under async
    scheduling is while the device runs the next step (engine.py ``take_deferred_outputs``).

    Under async scheduling (engine/overlap.py) a token sampled by a step still running on the
    device is a *placeholder* at the end of ``token_ids`` (``num_pending`` of them, at most two):
    it counts for scheduling (positions, blocks), and :meth:`append_token` later fills it in.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 eos_token_ids: tuple[int, ...], max_model_len: int, detokenizer,
                 generator: torch.Generator | None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        room = max_model_len - len(prompt_token_ids)
        self.max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        self.detok = detokenizer
        self.generator = generator
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []
        self.state_slot: int | None = None   # recurrent-state slot (hybrid models)
        self.num_pending = 0                  # placeholder tokens at the end of token_ids
        self.draft_token_ids: list[int] = []
        self.draft_probs: torch.Tensor | None = None
        self.spec = SpecStats()
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.arrival_time = time.monotonic()
        self._new_ids: list[int] = []
        self._new_logprobs: list[TokenLogprob] = []
        # output ids still to feed a detokenizer without stop strings (not all of _new_ids: a
        # token that ends the request as EOS or a stop id is never decoded)
        self._undecoded: list[int] = []

    # ---- progress --------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        """True until every token but the newest has its K/V in the cache."""
        return self.num_computed_tokens < self.num_tokens - 1

    @property
    def room_for_drafts(self) -> int:
        """Most draft tokens this step may carry without passing max_tokens or max_model_len
        (tokens still pending on the device count as output: async scheduling)."""
        left_tokens = self.max_tokens - len(self.output_token_ids) - self.num_pending - 1
        left_positions = self.max_model_len - self.num_tokens
        return max(0, min(left_tokens, left_positions))

    @property
    def finishes_by_length(self) -> bool:
        """True when the tokens already sampled (placeholders included) reach ``max_tokens`` or
        ``max_model_len``: the sequence ends whatever they are, so it needs no further step."""
        return (len(self.output_token_ids) + self.num_pending >= self.max_tokens
                or self.num_tokens >= self.max_model_len)

    @property
    def first_delta_due(self) -> bool:
        """True while no delta with tokens has been taken (:meth:`take_output`): the next one
        carries the first output token."""
        return len(self._new_ids) == len(self.output_token_ids)

    # ---- appending -------------------------------------------------------------------------
    def add_placeholder(self) -> None:
        """Reserve the position of a token being sampled on the device (async scheduling)."""
        self.token_ids.append(PLACEHOLDER_TOKEN)
        self.num_pending += 1

    def append_token(self, token_id: int, logprob: TokenLogprob | None = None) -> bool:
        """Add one generated token (filling the oldest placeholder, if any) and check every stop
        condition; return True if finished."""
        assert not self.is_finished, "token appended to a finished sequence"
        n_before = len(self.output_token_ids)
        if self.num_pending:
            self.token_ids[len(self.token_ids) - self.num_pending] = token_id
            self.num_pending -= 1
        else:
            self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)
        self._new_ids.append(token_id)
        if logprob is not None:
            self._new_logprobs.append(logprob)
        p = self.params
        may_stop = n_before >= p.min_tokens
        if may_stop and not p.ignore_eos and token_id in self.eos_token_ids:
            return self.finish("stop", None)
        if may_stop and token_id in p.stop_token_ids:
            return self.finish("stop", token_id)
        if not self.detok.has_stops:
            self._undecoded.append(token_id)
        else:
            matched = self.detok.append(token_id)
            if matched is not None:
                return self.finish("stop", matched)
        if len(self.output_token_ids) >= self.max_tokens \
                or self.num_tokens - self.num_pending >= self.max_model_len:
            return self.finish("length", None)
        return False

    def finish(self, reason: str, stop_reason: int | str | None = None) -> bool:
        self.status = SequenceStatus.FINISHED
        self.finish_reason, self.stop_reason = reason, stop_reason
        return True

    # ---- output ------------------------------------------------------------------------------
    def take_output(self) -> RequestOutput:
        """The delta since the last call (new tokens, newly releasable text)."""
        for token_id in self._undecoded:
            self.detok.append(token_id)
        self._undecoded.clear()
        text = self.detok.take_new_text()
        if self.is_finished and not isinstance(self.stop_reason, str):
            text += self.detok.finish()
        out = RequestOutput(
            request_id=self.request_id,
            new_token_ids=self._new_ids,
            new_text=text,
            new_logprobs=self._new_logprobs if self.params.logprobs is not None else None,
            finished=self.is_finished,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            num_prompt_tokens=self.num_prompt_tokens,
            num_output_tokens=len(self.output_token_ids),
            num_cached_tokens=self.num_cached_tokens,
            spec=self.spec if self.spec.num_verify_steps else None,
        )
        self._new_ids, self._new_logprobs = [], []
        return out
