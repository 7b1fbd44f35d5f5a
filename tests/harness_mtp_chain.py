"""MTP engines whose draft calls are logged, and a draft-length policy stand-in, for the draft
chain tests (test_mtp_chain.py on the CPU, test_gpu.py)."""

from __future__ import annotations

from mtpserve import LLM


class Budgets:
    """The i-th request seen drafts (i + step) % (k + 1) tokens at each step (capped by the room
    it has), so one batch mixes 0..k drafts and every request's budget changes every step."""

    def __init__(self, k: int):
        self.k, self.step, self.index = k, 0, {}

    def set_batch(self, num_seqs: int) -> None:
        self.step += 1

    def allow_drafts(self) -> bool:
        return True

    def num_drafts(self, seq) -> int:
        i = self.index.setdefault(seq.request_id, len(self.index))
        return (i + self.step) % (self.k + 1)

    def would_draft(self, seq) -> int:
        """What ``num_drafts`` answers now (DraftLengthPolicy's side-effect-free look)."""
        return self.num_drafts(seq)

    def num_drafts_after(self, seq, num_drafts: int, num_accepted: int) -> int:
        """What ``num_drafts`` answers next step (DraftLengthPolicy's preview)."""
        i = self.index.setdefault(seq.request_id, len(self.index))
        return (i + self.step + 1) % (self.k + 1)

    def record(self, *args, **kwargs) -> None: ...

    def record_step(self, *args, **kwargs) -> None: ...

    def forget(self, seq) -> None: ...


def mtp_llm(path, use_chain: bool, k: int, ahead: bool = False, **engine) -> tuple[LLM, list]:
    """An MTP engine (``engine``: LLM keyword arguments) drafting k tokens with the Budgets
    policy, through the chain or (``use_chain`` False) the step loop, drafting ahead
    (spec/draft_ahead.py) only with ``ahead``. Returns it and the log its draft calls fill: per
    call, (request id, budget, drafts, greedy) of each sequence asked, and the rows the chain
    drafted (0: the loop ran)."""
    llm = LLM(str(path), speculative_algorithm="nextn", speculative_num_steps=k,
              speculative_adaptive=False, **engine)
    proposer = llm.engine.proposer
    proposer.policy, proposer.use_chain = Budgets(k), use_chain
    proposer.draft_ahead = ahead
    log, draft, chain_run = [], proposer.draft, proposer.chain.run
    used = []

    def logged(work):
        used.clear()
        draft(work)
        log.append(([(s.request_id, budget, drafts_of(proposer, s), s.params.greedy)
                     for s, budget in work], used[0] if used else 0))

    def chained(hidden, rows, steps):
        used.append(len(rows))
        return chain_run(hidden, rows, steps)

    proposer.draft, proposer.chain.run = logged, chained
    return llm, log


def drafts_of(proposer, seq) -> list[int]:
    """``seq``'s drafts just after ``proposer.draft``: the host list, or, for chain drafts
    still on the device (spec/pending_drafts.py), their row of the chain's output."""
    p = proposer.pending
    if p is None or seq.request_id not in p.rows:
        return list(seq.draft_token_ids)
    return p.drafts[p.rows[seq.request_id]].tolist()[:len(seq.draft_token_ids)]
