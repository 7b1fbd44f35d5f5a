"""MTP drafting that starts before the host knows what the verify step accepted.

In a synchronous speculative step the host reads the verify forward's targets back, decides
what was accepted, and only then launches the MTP's ``observe`` forward and the next step's
draft chain: the GPU idles while the host works, and the host waits while those run. For
greedy sequences nothing there needs the host:

- the target's choice at every verified position is ``argmax(logits)``, and the drafts
  accepted are the longest prefix of drafts equal to it (:func:`greedy_acceptance`, on the
  device);
- the MTP pair at verified position ``L - 1 + i`` is (h, the token after it), and for every
  position the step keeps (``i <= accepted``) that token is the target's choice there: drafts
  accepted equal it, the last emitted token is it. So ``observe`` can run over *all* verified
  positions with the argmax as input ids; the pairs past the accepted ones write MTP K/V that
  nobody counts as valid (the shadow's ``num_computed_tokens`` stops at the accepted ones, and
  the next forwards overwrite them), exactly as chained draft K/V are forgotten (spec/mtp.py);
- draft 1 comes from the MTP output at the accepted position, picked on the device, and the
  chain's layout (positions, KV slots, key counts) for every possible acceptance is laid out on
  the host; the device picks each row's (``DraftChain.run_variants``).

The host reads back only the targets and the acceptance (:class:`AheadStep`, a copy recorded
right after the acceptance kernel), so it post-processes, schedules and prepares the next
verify step while the observe forward and the chain run. The engine takes the targets from
here instead of reading the argmax again (spec/verify.py ``targets``), so both decide the same.

Sampled sequences (their drafts the MTP's argmax, a one-hot q) go the same way: their targets
are the tokens speculative sampling emits at each row if kept, drawn on the device
(spec/sampled_ahead.py), and everything above holds with "argmax" read as "target".
"""

from __future__ import annotations

import torch

from mtpserve.engine.forward_batch import HostCopy, to_device
from mtpserve.engine.sampler import SamplingRow, is_plain
from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from mtpserve.engine.sequence import Sequence
from mtpserve.kernels.dispatch import use_triton
from mtpserve.spec.mtp_chain import ChainRow


def decodes(s: ScheduledSeq) -> bool:
    """Whether ``s`` decodes its newest token this step (with drafts after it or none), as
    opposed to a prefill chunk."""
    return s.samples and s.num_new_tokens == 1


def plain(s: ScheduledSeq, sampled: bool = True) -> bool:
    """Whether ``s``'s rows choose from the raw logits as they are (``is_plain``: no bias,
    penalties or min_tokens ban; row 0 decides, the drafts only add output tokens), so the
    device decides them: greedy rows by the argmax, sampled ones (when ``sampled``) by
    spec/sampled_ahead.py."""
    seq = s.seq
    return is_plain(SamplingRow(seq.params, output_token_ids=seq.output_token_ids)) and (
        sampled or seq.params.greedy)


def goes_ahead(s: ScheduledSeq, st, sampled: bool = True) -> bool:
    """Whether ``s``'s step can go ahead: it decodes (:func:`decodes`: policy, room or token
    budget may have given it no drafts this step) with :func:`plain` rows, and its MTP state
    ``st`` (spec/mtp.py ``_MTPState``, or None) is sound and in step with it."""
    return (decodes(s) and plain(s, sampled) and st is not None and not st.broken
            and st.shadow.num_computed_tokens == s.seq.num_computed_tokens)


def next_budgets(seq: Sequence, num_drafts: int, k: int) -> list[int]:
    """Per v = 0..``num_drafts``: the drafts ``seq`` may carry next step if v of its drafts get
    accepted (propose's budget once v drafts and the bonus token are appended; no policy)."""
    return [min(k, max(0, seq.room_for_drafts - v - 1)) for v in range(num_drafts + 1)]


def shadow_tokens(seq: Sequence, budgets: list[int]) -> int:
    """Tokens the MTP shadow of ``seq`` (L tokens, ``len(budgets) - 1`` drafts m) must hold
    blocks for: the observe over positions up to L - 1 + m, and every variant's chain (its
    last real step at position L + v - 2 + budget)."""
    L, m = seq.num_tokens, len(budgets) - 1
    return max([L + m] + [L + v - 1 + max(b, 1) for v, b in enumerate(budgets)])


def chain_row(seq: Sequence, block_table: list[int], budgets: list[int], v: int) -> ChainRow:
    """``seq``'s chain row (its shadow's ``block_table``) if ``v`` of its drafts get accepted
    (``budgets[v]``: the drafts it may then carry; a budget-0 row still runs one step, unused);
    a v past its drafts never happens: the row of its last."""
    v = min(v, len(budgets) - 1)
    return ChainRow(block_table, seq.num_tokens + v + 1, max(budgets[v], 1))


def ahead_layout(sched: SchedulerOutput, layout, rows: list[int]
                 ) -> tuple[list[int], list[int], list[int]]:
    """Where the scheduled sequences ``rows`` (indices into ``sched.scheduled``) lie: each one's
    first token in the batch, its first logits row (``layout``: the step's
    ``ModelRunner.prepare`` LogitsLayout), and its first token in the observe batch (those
    sequences' 1 + drafts tokens back to back)."""
    tokens, t = [], 0
    for s in sched.scheduled:
        tokens.append(t)
        t += s.num_query_tokens
    observe, o = [], 0
    for i in rows:
        observe.append(o)
        o += 1 + len(sched.scheduled[i].draft_token_ids)
    return [tokens[i] for i in rows], [layout.rows[i][0] for i in rows], observe


def observe_inputs(targets: torch.Tensor, hidden: torch.Tensor, token_firsts: list[int],
                   logit_firsts: list[int], num_drafts: list[int]):
    """The observe batch's input ids [O] (the targets at each verified position) and target
    hidden states [O, H] of the sequences laid out by :func:`ahead_layout`; ``targets`` [N]
    per logits row, ``hidden`` [T, H] per batch token. Views when they are the whole batch in
    order, else one upload of indices."""
    spans = [1 + m for m in num_drafts]
    whole = sum(spans) == targets.shape[0] == hidden.shape[0]
    if whole and token_firsts == logit_firsts:
        return targets, hidden
    rows = [f + j for f, n in zip(logit_firsts, spans) for j in range(n)]
    toks = [f + j for f, n in zip(token_firsts, spans) for j in range(n)]
    idx = to_device(rows + toks, torch.int64, targets.device)
    return targets.index_select(0, idx[:len(rows)]), hidden.index_select(0, idx[len(rows):])


def greedy_acceptance(targets: torch.Tensor, input_ids: torch.Tensor, target_firsts: list[int],
                      token_firsts: list[int], num_drafts: list[int], k: int) -> torch.Tensor:
    """Drafts accepted per sequence of a verify batch, on the device, no host sync.

    Args:
        targets: [N] int64, the target's choice at each logits row of the batch (the argmax,
            or spec/sampled_ahead.py's token for a sampled row).
        input_ids: [T] int64, the batch's input ids.
        target_firsts: per sequence (B), its first logits row (the target's choice after its
            newest token, then after each draft); token_firsts: its first token in the batch
            (its newest token, followed by its drafts); num_drafts: its drafts (0..k; 0: a
            decode row, nothing to accept); k: the most drafts of any sequence (>= 1).

    Returns:
        accepted [B] int64: the longest prefix of drafts with ``draft i == target at i``.
    """
    B, n = len(token_firsts), len(token_firsts) * k
    if uniform(targets, input_ids, target_firsts, token_firsts, num_drafts, k):
        return uniform_acceptance(input_ids, targets, B, k)
    # row i of a sequence compares its target at logits row cur with its draft at token nxt
    # (indices kept inside the sequence's rows where i has no draft: masked out by valid)
    cur, nxt, valid = [], [], []
    for tf, xf, m in zip(target_firsts, token_firsts, num_drafts):
        for i in range(k):
            j = max(0, min(i, m - 1))
            cur.append(tf + j)
            nxt.append(xf + j + (m > 0))
            valid.append(int(i < m))
    up = to_device(cur + nxt + valid, torch.int64, targets.device)
    cur_t, nxt_t, valid_t = up[:n], up[n:2 * n], up[2 * n:].bool()
    match = (input_ids.index_select(0, nxt_t) == targets.index_select(0, cur_t)) & valid_t
    return match.view(B, k).long().cumprod(1).sum(1)


def uniform_acceptance(input_ids: torch.Tensor, targets: torch.Tensor, B: int, k: int,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`greedy_acceptance` when every one of B sequences verifies k drafts, back to back
    (:func:`uniform`): views compared, nothing uploaded (graph-capturable). ``input_ids``,
    ``targets`` [B (k + 1)] int64; returns accepted [B] int64 (written into ``out`` if given).
    On CUDA one kernel (kernels/accept_triton.py) where PyTorch takes four."""
    if use_triton(input_ids) and input_ids.is_contiguous() and targets.is_contiguous():
        from mtpserve.kernels.accept_triton import accepted_prefix

        return accepted_prefix(input_ids, targets, B, k, out=out)
    match = input_ids.view(B, k + 1)[:, 1:] == targets.view(B, k + 1)[:, :k]
    return torch.sum(match.long().cumprod(1), 1, out=out)


def commit_ahead(batch, ahead: AheadStep, rows: list[int]) -> None:
    """Roll each verified sequence's recurrent state back to its accepted drafts on the device
    (``StateCache.commit_rows``, from the device's count), so the host need not after its
    read-back: when ``ahead``'s sequences (batch indices ``rows``) are all the sequences of a
    hybrid batch, in order, sequence b on scratch row b. Sets ``ahead.committed``."""
    meta = batch.extra.get("linear_attn")
    B = len(rows)
    if meta is None or not rows == meta.scratch_rows == list(range(B)):
        return
    rows = _arange(B, ahead.accepted_t.device)
    meta.cache.commit_rows(meta.slots, rows, ahead.accepted_t)
    ahead.committed = True


_aranges: dict = {}


def _arange(n: int, device) -> torch.Tensor:
    """torch.arange(n) on ``device`` as int64, made once per (n, device)."""
    t = _aranges.get((n, device))
    if t is None:
        t = _aranges[(n, device)] = torch.arange(n, device=device)
    return t


def uniform(targets: torch.Tensor, input_ids: torch.Tensor, target_firsts: list[int],
            token_firsts: list[int], num_drafts: list[int], k: int) -> bool:
    """Whether the batch is only sequences of 1 + k tokens, each with a logits row per token,
    in order (a verify step of k drafts everywhere): then row b's tokens and logits rows are
    b (k + 1) .. b (k + 1) + k."""
    n = len(token_firsts) * (k + 1)
    return (targets.shape[0] == input_ids.shape[0] == n and all(m == k for m in num_drafts)
            and target_firsts == token_firsts == list(range(0, n, k + 1)))


class AheadStep:
    """One verify step's greedy targets and acceptance on their way to the host, and what the
    proposer launched from them without waiting.

    Args:
        targets: [T] int64 on the device; accepted: [B] int64 on the device; seqs: the B
            verified sequences in batch order; starts: each one's first verified position
            (``L - 1``); both: [T + B] int64, targets then accepted in one tensor when they
            are (a verify graph's output: engine/hybrid_graph.py), else None.

    After construction the proposer sets ``hidden`` (the MTP output at each row's accepted
    position, [B, H]), ``drafts`` ([B, m] int64, the next step's chain drafts; None when no
    row drafts next step) and ``budgets`` (per row, the drafts planned for it if v drafts get
    accepted, v = 0..its drafts).
    """

    def __init__(self, targets: torch.Tensor, accepted: torch.Tensor, seqs: list[Sequence],
                 starts: list[int], both: torch.Tensor | None = None):
        self.rows = {s.request_id: i for i, s in enumerate(seqs)}
        self.starts = starts
        self._T = targets.shape[0]
        self.accepted_t = accepted
        # queued now: reading it waits for the acceptance, not for what is launched after it
        self._copy = HostCopy(both if both is not None else torch.cat([targets, accepted]))
        self._values: list[int] | None = None
        self.hidden: torch.Tensor | None = None
        self.drafts: torch.Tensor | None = None
        self.budgets: list[list[int]] = []
        self.committed = False   # recurrent states rolled back on the device (commit_ahead)

    def committed_as(self, request_id: str, accepted: int) -> bool:
        """Whether the recurrent state of ``request_id`` was rolled back on the device to
        ``accepted`` drafts, what the host found (the same targets decide both; should they
        ever differ, the host commits its own count)."""
        row = self.rows.get(request_id)
        return self.committed and row is not None and self.accepted(row) == accepted

    def _read(self) -> list[int]:
        if self._values is None:
            self._values = self._copy.tolist()
        return self._values

    def targets(self) -> list[int]:
        """The target's argmax at every token of the batch (host ints; waits for the copy)."""
        return self._read()[:self._T]

    def accepted(self, row: int) -> int:
        """Drafts the device found accepted for row ``row``."""
        return self._read()[self._T + row]
