"""Async scheduling: the host prepares step n+1 while the device still runs step n.

A synchronous engine step is host work (schedule, prepare, launch), then device work, then host
work again (read the sampled tokens, stop checks, detokenize). With CUDA graphs the device part
of a small-batch step is short, so the host parts add up to a large share of the step (measured
on the H200: 0.36 ms of a 2.0 ms batch-1 step of a 1.7B model, several ms at 64 requests).

Here a step is launched before the previous step's tokens reach the host (SGLang's overlap
scheduler, vLLM's ``--async-scheduling``): each sampling sequence gets a placeholder token
(``Sequence.add_placeholder``) so the scheduler can place its next position, the next step's
input id for that row is taken on the device from the previous step's sampled ids
(:func:`patch_input_ids`), and the previous step's tokens are then read back and checked while
the new step runs (:class:`PendingStep`). A sequence that finishes on the token read back has
already been scheduled once more; that extra token is dropped and never seen by the client, and
its K/V write is that of a real token of the sequence (its last), so nothing else is touched.

Only steps whose sampling needs nothing from the host about the pending tokens overlap: no
drafts (they depend on the newest token), no repetition / presence / frequency penalties and no
``min_tokens`` (both read the output so far). Under speculation, steps where nothing drafts (the
draft-length policy's load gate vetoes, or the policy gives every sequence 0 drafts) overlap
when the proposer may skip steps (n-gram: its index catches up whenever it drafts; a draft
model: its first pass of a proposal computes every token accepted since the last) or can follow
a step before it is read back: MTP keeps every position the step computed, paired on the device
with the token after it (:func:`next_token_ids`: the sampled ids, or the prompt's next token
after a prefill chunk), and observes them in one forward before it drafts again
(spec/mtp_backlog.py). The gate then compares drafting steps against overlapped plain steps,
which is what the speculation would be competing against. The engine drains the pipeline before
any other step, so greedy and seeded outputs are identical to synchronous steps, with one
exception under speculation: a request whose pending token turns out to end it (EOS, a stop
token or string) holds its KV blocks and batch slot until the token is read back, so under KV or
batch pressure a waiting request may be admitted a step later than by the synchronous engine;
the drafts then differ, and with them how many draws a seeded sampling request makes (greedy
outputs never differ). A request that ends by length whatever its pending tokens are gives its
blocks and slot back when the next step is scheduled (scheduler.py ``_retire``), as the
synchronous engine does. Unseeded sampled rows share one generator (engine/sampler.py), so the
extra row of a sequence that has in fact finished shifts their random stream: their tokens
follow the same distribution but differ, as they do whenever the batch changes. Full KV blocks
are published for prefix caching when a step is launched (placeholders excluded), so a request
admitted by the next step finds them.

Steps that cannot overlap (drafting steps, penalties) still run synchronously, but under async
scheduling their mid-stream deltas are taken by the next call, after that call's step is
launched (engine.py ``take_deferred_outputs``): the tokens are appended and every stop checked
before the next step is scheduled, while detokenizing (for requests without stop strings, whose
text cannot end them: sequence.py) and building the outputs run while the device computes the
next step instead of between the read-back and the next launch. A request's first delta and
its last come at once (time to first token and to completion as without the deferral), and
the call whose step leaves nothing to run returns the rest. An abort or a stop of the server's
loop takes them first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtpserve.engine.forward_batch import ForwardBatch, HostCopy, to_device
from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from mtpserve.engine.sampler import SamplerOutput
from mtpserve.sampling_params import SamplingParams


def overlappable(params: SamplingParams) -> bool:
    """Whether a request's sampling can run before its previous token is on the host."""
    return not params.needs_penalties and params.min_tokens == 0


@dataclass
class PendingStep:
    """A launched step whose sampled tokens are not yet on the host.

    ``sched``: the step's schedule; ``sampling``: its (scheduled sequence, logits row) pairs in
    row order; ``tokens``: sampled ids ``[N]`` int64 on the device (the next step reads them
    there); ``host``: their copy on its way to the host; ``logprobs``: per row, as the sampler
    returned them; ``row_of``: request id -> row; ``arm``: the load gate's decision on it
    (spec/policy.py ``GateArm``; None: no gate, or a step of prefills alone).
    """

    sched: SchedulerOutput
    sampling: list[tuple[ScheduledSeq, int]]
    tokens: torch.Tensor
    host: HostCopy
    logprobs: list | None
    row_of: dict[str, int]
    arm: object = None

    @classmethod
    def launch(cls, sched: SchedulerOutput, sampling: list[tuple[ScheduledSeq, int]],
               result: SamplerOutput, arm=None) -> "PendingStep":
        """Start copying ``result.token_ids`` to the host and give each sampling sequence its
        placeholder token."""
        tokens = result.token_ids
        host = HostCopy(tokens)
        for s, _ in sampling:
            s.seq.add_placeholder()
        row_of = {s.seq.request_id: i for i, (s, _) in enumerate(sampling)}
        return cls(sched, sampling, tokens, host, result.logprobs, row_of, arm)

    def token_ids(self) -> list[int]:
        """The sampled ids as a host list (waits for the step's copy)."""
        return self.host.tolist()


def patch_input_ids(batch: ForwardBatch, sched: SchedulerOutput, prev: PendingStep) -> None:
    """Write into ``batch.input_ids`` (on the device, no host sync) the ids that ``prev`` sampled
    for rows whose input is still a placeholder (a sequence's newest token, the last of its
    query). Raises ``RuntimeError`` for a placeholder that ``prev`` did not sample."""
    dst, src, offset = [], [], 0
    for s, q in zip(sched.scheduled, batch.query_lens_cpu):
        offset += q
        seq = s.seq
        if seq.num_pending:
            if seq.num_pending != 1 or seq.request_id not in prev.row_of:
                raise RuntimeError(f"request {seq.request_id}: placeholder without a pending "
                                   f"token")
            dst.append(offset - 1 - len(s.draft_token_ids))
            src.append(prev.row_of[seq.request_id])
    if dst:
        idx = to_device(dst + src, torch.int64, batch.input_ids.device)
        n = len(dst)
        batch.input_ids.index_copy_(0, idx[:n], prev.tokens.index_select(0, idx[n:]))


def next_token_ids(batch: ForwardBatch, sched: SchedulerOutput, sampled: torch.Tensor,
                   prev: PendingStep | None) -> torch.Tensor:
    """Per batch token of a launched plain step (no drafts), the id of the token after it in
    its sequence, on the device without a host sync: what an MTP proposer pairs with each
    token's hidden state (spec/mtp.py ``observe_launched``).

    Args:
        batch: the step's ForwardBatch (``input_ids`` [T] int64, placeholders already patched);
        sched: its schedule, ``num_computed_tokens`` already advanced past the step's tokens;
        sampled: [N] int64, the token sampled for each sampling sequence, in schedule order;
        prev: the step before it, still pending (its tokens fill a placeholder after a prefill
            chunk), or None.

    Returns:
        [T] int64: within a sequence's chunk the next input token; after its last token the
        token sampled there, or for a prefill chunk that does not end the prompt the prompt's
        next token (``prev``'s token when that one is still a placeholder). ``sampled`` itself
        when every sequence decodes one token.

    Raises:
        RuntimeError: a placeholder that ``prev`` did not sample.
    """
    T = batch.num_tokens
    if sampled.shape[0] == T == len(sched.scheduled):
        return sampled
    prev_tokens = prev.tokens if prev is not None else sampled.new_empty(0)
    base = T + sampled.shape[0] + prev_tokens.shape[0]   # where host-known ids start
    idx, known, offset, row = [], [], 0, 0
    for s in sched.scheduled:
        n, seq = s.num_new_tokens, s.seq
        idx.extend(range(offset + 1, offset + n))
        offset += n
        if s.samples:
            idx.append(T + row)
            row += 1
        elif seq.num_computed_tokens < seq.num_tokens - seq.num_pending:
            idx.append(base + len(known))
            known.append(seq.token_ids[seq.num_computed_tokens])
        elif prev is not None and seq.request_id in prev.row_of:
            idx.append(T + sampled.shape[0] + prev.row_of[seq.request_id])
        else:
            raise RuntimeError(f"request {seq.request_id}: placeholder without a pending token")
    up = to_device(idx + known, torch.int64, sampled.device)
    src = torch.cat([batch.input_ids, sampled, prev_tokens, up[len(idx):]])
    return src.index_select(0, up[:len(idx)])
