"""MTP (NEXTN) proposer: drafts with the checkpoint's own multi-token-prediction layer.

The MTP module (models/mtp.py) maps the pair (target hidden state h_t, next token x_{t+1}) at
position t to a hidden state whose logits predict x_{t+2}. Its attention layer keeps a KV cache
of its own, indexed by the target's positions. We keep, per request, a *shadow* sequence whose
token at position t is x_{t+1} (the request's tokens shifted left by one), so the shared
``ModelRunner.prepare`` lays out the MTP's batches and block tables as for any model.

After every target step (:meth:`observe`) the MTP runs over the pairs that step made valid:
positions whose target hidden state was computed and kept (all prefill tokens; for a verify
step, the last accepted token and the accepted drafts). Its output at the last one, y at
position L - 2 (L = tokens so far), predicts the next token: that is draft 1. Drafts 2..m
chain: (y_{s-1}, d_{s-1}) at position L - 3 + s. Those chained K/V entries were made from draft
states, so the shadow forgets them at once; the next ``observe`` overwrites them with the
target's real hidden states. The MTP therefore never needs its own rollback. Plain steps
launched overlapped under async scheduling (nothing drafts) are observed later, all at once,
before the next drafting step (:meth:`observe_launched`, mtp_backlog.py).

When every drafting sequence is greedy, all drafts of a step come from one host-side layout and
(on CUDA) one graph replay (mtp_chain.py, mtp_chain_graph.py), and stay on the device until the
verify forward is queued (pending_drafts.py), so the host schedules and prepares while the chain
runs; sampling drafts, which need the host between steps, go step by step (``_draft_loop``, the
chain's reference in the tests).
Both end each step in the draft head (spec/draft_head.py): the target's LM head, or with
``--speculative-token-map`` FR-Spec's head over the map's tokens (drafts only from the map;
sampled drafts' q zero outside it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtpserve.engine.block_manager import BlockManager
from mtpserve.engine.forward_batch import to_device
from mtpserve.engine.model_runner import ModelRunner
from mtpserve.engine.sampler import Sampler, SamplingRow, make_generator
from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from mtpserve.engine.sequence import Sequence
from mtpserve.kernels.compile_ahead import compiling_ahead
from mtpserve.sampling_params import SamplingParams
from mtpserve.spec.draft_head import FullVocabHead
from mtpserve.spec.draft_ahead import (AheadStep, ahead_layout, chain_row, commit_ahead, decodes,
                                       goes_ahead, greedy_acceptance, next_budgets,
                                       observe_inputs, plain, shadow_tokens, uniform)
from mtpserve.spec.draft_model import DRAFT_SEED_OFFSET
from mtpserve.spec.mtp_backlog import ObserveBacklog
from mtpserve.spec.mtp_chain import ChainRow, DraftChain
from mtpserve.spec.mtp_compile import observe_layouts
from mtpserve.spec.pending_drafts import PendingDrafts
from mtpserve.spec.proposer import Proposer
from mtpserve.spec.sampled_ahead import sample_targets

_GREEDY = SamplingParams(temperature=0.0)


@dataclass
class _MTPState:
    shadow: Sequence            # token t = x_{t+1}; num_computed = MTP K/V positions made valid
    last_hidden: torch.Tensor | None   # MTP output at the newest valid pair: draft 1's logits
    generator: torch.Generator | None
    broken: bool = False        # the MTP cache ran out of blocks: no more drafts for it
    # shadow blocks held before a verify step drafting ahead grew them (what the usual step
    # holds then); the read-back trims the shadow back to what the usual observe leaves
    usual_blocks: int = 0


class MTPProposer(Proposer):
    """Drafts with ``target.mtp`` over the KV pool of ``runner`` (built with ``model=target.mtp``).

    Args:
        num_steps: k; target: the target model (its ``mtp``, ``compute_logits``);
        eos_token_ids: for the min_tokens ban while drafting; policy: the draft-length policy;
        head: the draft LM head (spec/draft_head.py; None: the target's full head).
    """

    observes_launched = True

    def __init__(self, num_steps: int, target, runner: ModelRunner,
                 eos_token_ids: tuple[int, ...], policy=None, head=None):
        super().__init__(num_steps, policy)
        self.target, self.mtp, self.runner = target, target.mtp, runner
        self.head = head if head is not None else FullVocabHead(target)
        self.bm = BlockManager(runner.num_blocks, runner.block_size, enable_prefix_caching=False)
        self.sampler = Sampler(target.config.vocab_size, seed=DRAFT_SEED_OFFSET)
        self.eos = eos_token_ids
        self.states: dict[str, _MTPState] = {}
        self.chain = DraftChain(target, runner, self.head)
        self.use_chain = True   # argmax drafts go through self.chain (off: the step loop)
        # Sampling requests draft the MTP's argmax too (a one-hot q, as vLLM's and SGLang's
        # MTP / EAGLE drafts do; verify.py accepts draft x with probability p(x)): one chain
        # replay, no host round trip per draft. True: draw them from the MTP's processed
        # distribution step by step (the step loop; q kept for the residual).
        self.sampled_drafts = False
        self.draft_ahead = True   # greedy verify steps observe and draft before the read-back
        # plain steps launched overlapped and not observed yet (mtp_backlog.py)
        self.backlog = ObserveBacklog(runner.config.max_num_batched_tokens)
        self.pending: PendingDrafts | None = None   # this step's chain drafts, on the device
        self.ahead: AheadStep | None = None        # the verify step observed ahead, if any
        # drafts the last verify step made ahead: (drafts [B, m] on the device,
        # request id -> (row, the sequence's token count they were made for, real drafts in
        # the row: the chain steps planned for it))
        self._ahead_drafts: tuple[torch.Tensor, dict[str, tuple[int, int, int]]] | None = None

    # ---- after each target step: extend the MTP's cache with the real hidden states -------
    @torch.inference_mode()
    def observe(self, items: list[tuple[Sequence, int, torch.Tensor]]) -> None:
        """``items``: (sequence, first position, target hidden states [n, H] of positions
        first..first+n-1, all of them valid)."""
        self.catch_up()   # plain steps still in the backlog come first
        if self.ahead is not None:
            items = self._observed_ahead(items)
        sched, hiddens, states = SchedulerOutput(), [], []
        keep = self._observable([seq for seq, _, _ in items])
        for seq, start, hidden in items:
            if id(seq) not in keep:
                continue
            st = self._admit(seq, start, hidden.shape[0])
            if st is not None:
                sched.scheduled.append(ScheduledSeq(st.shadow, hidden.shape[0], []))
                hiddens.append(hidden)
                states.append(st)
        if states:
            self._observe_forward(sched, states, torch.cat(hiddens))

    @torch.inference_mode()
    def observe_launched(self, sched: SchedulerOutput, hidden: torch.Tensor,
                         next_ids: torch.Tensor) -> None:
        """A plain step launched but not read back (async scheduling): every position it
        computed, paired with the token after it on the device (no host sync), so plain steps
        of an MTP engine overlap like any engine's (engine/overlap.py). Kept in the backlog
        (mtp_backlog.py) and observed in one forward with the steps after it when a step
        drafts again (:meth:`catch_up`), or now when the backlog is full.

        The shadows take their blocks now, step by step in schedule order, as the synchronous
        ``observe`` after each step does; only the forward waits. Taking them at the catch-up
        instead (a run of steps per sequence at once, finished sequences left out) made the pool
        run short elsewhere than in the synchronous engine when preempted sequences hold shadow
        blocks: another sequence's state broke for good, so other sequences drafted (and a
        seeded sampling request drew other tokens)."""
        admitted = False
        keep = self._observable([s.seq for s in sched.scheduled])
        for s in sched.scheduled:
            if id(s.seq) not in keep:
                continue
            if s.seq.finishes_by_length:   # its last step: never observed (as the sync engine)
                continue
            n = s.num_new_tokens
            st = self._admit(s.seq, s.seq.num_computed_tokens - n, n)
            if st is not None:   # its K/V comes in the catch-up's forward
                st.shadow.num_computed_tokens += n
                admitted = True
        if not admitted:   # every sequence benched, broken or finishing: nothing to observe
            return
        self.backlog.add(sched, hidden, next_ids)
        if self.backlog.full:
            self.catch_up()

    @torch.inference_mode()
    def catch_up(self) -> None:
        """Observe every plain step in the backlog, one forward for all (mtp_backlog.py): the
        positions :meth:`observe_launched` admitted (blocks taken, shadows counted past them),
        per sequence its latest run. A sequence that turned out to have finished is left out
        (one that finished on a step's token since the backlog was last full is observed all
        the same; its state goes when it is released), and so is one whose state broke."""
        if not len(self.backlog):
            return
        runs, hidden, ids = self.backlog.take()
        obs, rows, states = SchedulerOutput(), [], []
        for r in runs:
            st = self.states.get(r.seq.request_id)
            if st is None or st.broken:
                continue
            sh, n = st.shadow, len(r.rows)
            if sh.num_computed_tokens != r.start + n:   # not what was admitted: never draft
                self._break(st)
                continue
            sh.token_ids = r.seq.token_ids[1:]
            sh.num_computed_tokens = r.start   # the forward lays the run out from its start
            obs.scheduled.append(ScheduledSeq(sh, n, []))
            rows.extend(r.rows)
            states.append(st)
        if states:
            self._observe_forward(obs, states, _take(hidden, rows), _take(ids, rows))

    def _admit(self, seq: Sequence, start: int, n: int) -> _MTPState | None:
        """``seq``'s MTP state, its shadow given blocks for an observe of ``n`` positions from
        ``start``; None (the state broken for good) when the shadow is not in step with
        ``start`` or the pool has no block for it. Only for sequences :meth:`_observable`
        keeps."""
        st = self._state(seq)
        sh = st.shadow
        sh.token_ids = seq.token_ids[1:]
        sh.num_computed_tokens = min(sh.num_computed_tokens, start)
        if st.broken or sh.num_computed_tokens != start or not self.bm.allocate(sh, start + n):
            self._break(st)
            return None
        return st

    def _observe_forward(self, sched: SchedulerOutput, states: list[_MTPState],
                         hidden: torch.Tensor, input_ids: torch.Tensor | None = None) -> None:
        """The MTP over ``sched``'s shadows (``hidden`` [O, H]: their target hidden states back
        to back; ``input_ids`` [O]: the tokens after them, None: the shadows' own); each state
        then holds its newest output (draft 1's hidden state)."""
        # a copy: a graph's output buffer is rewritten by the next replay of its size, and a
        # sequence not scheduled next step would then draft from another step's state
        y = self._forward(sched, hidden, input_ids=input_ids).clone()
        end = 0
        for st, s in zip(states, sched.scheduled):
            end += s.num_new_tokens
            st.shadow.num_computed_tokens += s.num_new_tokens
            st.last_hidden = y[end - 1]

    # ---- verify steps: decide, observe and draft before the host reads back (draft_ahead.py) -
    @torch.inference_mode()
    def verify_ahead(self, sched: SchedulerOutput, batch, layout, hidden: torch.Tensor,
                     logits: torch.Tensor, sampler=None, items=None) -> AheadStep | None:
        """Right after a verify forward is launched: when every sequence decoding its newest
        token does so with plain rows (draft_ahead.py ``plain``; most verifying drafts, some
        maybe none), decide each row's target on the device (greedy: the argmax; sampled:
        sampled_ahead.py), compute the acceptance there, run ``observe`` over every verified
        position and the next step's draft chain from the accepted one, all without a host
        sync; prefill chunks in the step are observed the usual way. ``batch``, ``layout``:
        the step's ``ModelRunner.prepare`` output (``layout``: each sequence's logits rows);
        ``hidden`` [T, H]: the forward's output per batch token; ``logits`` [N, vocab] per
        logits row; ``sampler``, ``items``: the engine's Sampler and the VerifyInputs it will
        verify, one per sampling row in order (without them only all-greedy steps go ahead).
        Returns the step (the engine verifies with its targets), or None when it does not apply
        (the step goes the usual way)."""
        work = self._ahead_work(sched, sampler is not None and items is not None)
        if work is None:
            return None
        rows = [i for i, _, _, _ in work]
        tok_f, logit_f, obs_f = ahead_layout(sched, layout, rows)
        counts = [len(sched.scheduled[i].draft_token_ids) for i in rows]
        sampled = [it for it in items or [] if not it.rows[0].params.greedy]
        both, N = batch.extra.get("acceptance"), logits.shape[0]   # decided inside the graph
        if both is not None and not sampled and uniform(both[:N], batch.input_ids, logit_f,
                                                        tok_f, counts, max(counts)):
            targets, accepted = both[:N], both[N:]
        else:
            targets, both = logits.argmax(-1), None
            sample_targets(sampler, logits, targets, sampled)
            accepted = greedy_acceptance(targets, batch.input_ids, logit_f, tok_f, counts,
                                         max(counts))
        seqs = [seq for _, seq, _, _ in work]
        ahead = AheadStep(targets, accepted, seqs, [q.num_computed_tokens for q in seqs], both)
        commit_ahead(batch, ahead, rows)
        ids, h = observe_inputs(targets, hidden, tok_f, logit_f, counts)
        obs = SchedulerOutput([ScheduledSeq(st.shadow, 1 + m, []) for (_, _, st, _), m
                               in zip(work, counts)])
        y = self._forward(obs, h, input_ids=ids)
        # row b's accepted position in the observe batch (one row: the acceptance itself)
        pick = accepted if len(obs_f) == 1 else to_device(obs_f, torch.int64, y.device) + accepted
        ahead.hidden = y.index_select(0, pick)
        variants = [[chain_row(seq, st.shadow.block_table, b, v) for _, seq, st, b in work]
                    for v in range(max(counts) + 1)]
        steps = max(max(b) for _, _, _, b in work)
        ahead.budgets = [b for _, _, _, b in work]
        # no chain when no variant of any row will draft next step (the policy says 0)
        ahead.drafts = (self.chain.run_variants(ahead.hidden, variants, accepted, steps)
                        if steps else None)
        self.ahead = ahead
        return ahead

    def _ahead_work(self, sched: SchedulerOutput, can_sample: bool = True
                    ) -> list[tuple[int, Sequence, _MTPState, list[int]]] | None:
        """Per decoding sequence (its index in ``sched.scheduled``, the sequence, its MTP state,
        its next budget if v drafts get accepted for v = 0..its drafts) when the step can go
        ahead, else None: a verify step whose decoding sequences all qualify (draft_ahead.py
        ``goes_ahead``), whose other sampling rows (prefill chunks that end their prompt) are
        plain too (the engine verifies every row with the targets decided here; sampled rows
        only with ``can_sample``: the engine's sampler at hand). Then grows each shadow's
        blocks for the observe over all its verified positions and the longest chain of any
        acceptance (more than the usual path takes). A step that fails the checks takes none,
        nor one whose growth and the usual observe of the step's other sequences (prefill
        chunks) do not all fit in the free blocks: the pool must run short exactly where the
        usual step's does (a shadow that finds no block breaks for good, a chain gets cut),
        else drafts, hence a sampling request's draws, differ. The extra blocks go back at the
        read-back (:meth:`_observed_ahead`) and the next step's chains take theirs as the usual
        chain does (:meth:`_draft_greedy`)."""
        scheduled = sched.scheduled
        if not (self.draft_ahead and self.use_chain and any(s.draft_token_ids
                                                             for s in scheduled)):
            return None
        rows = [i for i, s in enumerate(scheduled) if decodes(s) and not self._benched(s.seq)]
        states = [self.states.get(scheduled[i].seq.request_id) for i in rows]
        # sampled rows: when the engine lends its sampler, and not with drafts drawn from q
        # (their residual needs q, kept on the host)
        sampled = can_sample and not self.sampled_drafts
        if not (all(goes_ahead(scheduled[i], st, sampled) for i, st in zip(rows, states))
                and all(plain(s, sampled) for s in scheduled if s.samples)):
            return None
        work = [(i, scheduled[i].seq, st, self._next_budgets(scheduled[i]))
                for i, st in zip(rows, states)]
        need = sum(self.bm.blocks_needed(st.shadow, shadow_tokens(seq, b))
                   for _, seq, st, b in work)
        decoding = set(rows)
        need += sum(self._observe_blocks(s) for i, s in enumerate(scheduled)
                    if i not in decoding)
        if need > self.bm.num_free_blocks:
            return None
        for _, seq, st, b in work:
            st.usual_blocks = len(st.shadow.block_table)
            self.bm.allocate(st.shadow, shadow_tokens(seq, b))
        for i, seq, st, _ in work:
            st.shadow.token_ids = seq.token_ids[1:] + [0] * (1 + len(scheduled[i].draft_token_ids))
        return work

    def _observe_blocks(self, s: ScheduledSeq) -> int:
        """Shadow blocks :meth:`observe` takes for the prefill chunk ``s`` this step (at most:
        a chunk that finishes its request is not observed)."""
        st = self.states.get(s.seq.request_id)
        if (st is not None and st.broken) or self._benched(s.seq):
            return 0
        tokens = s.seq.num_computed_tokens + s.num_new_tokens
        held = len(st.shadow.block_table) if st is not None else 0
        return max(0, -(-tokens // self.bm.block_size) - held)

    def _next_budgets(self, s: ScheduledSeq) -> list[int]:
        """Per v = 0..``s``'s drafts: the drafts its next step will ask if v get accepted
        (draft_ahead.py ``next_budgets``, capped by the policy's answer after recording v), so
        the chain planned ahead runs no step the next one will not use."""
        m = len(s.draft_token_ids)
        budgets = next_budgets(s.seq, m, self.k)
        if self.policy is None:
            return budgets
        return [min(b, self.policy.num_drafts_after(s.seq, m, v)) for v, b in enumerate(budgets)]

    def _observed_ahead(self, items):
        """Finish the step observed ahead for ``items`` it covers (the accepted count the host
        found equals the device's: the same targets decide both); return the other items."""
        ahead, self.ahead = self.ahead, None
        rest, rows = [], {}
        for seq, start, hidden in items:
            row = ahead.rows.get(seq.request_id)
            st = self.states.get(seq.request_id)
            if row is None or st is None or start != ahead.starts[row] \
                    or hidden.shape[0] != ahead.accepted(row) + 1:
                rest.append((seq, start, hidden))
                continue
            st.shadow.token_ids = seq.token_ids[1:]
            st.shadow.num_computed_tokens = start + hidden.shape[0]
            # the blocks the usual observe leaves (the chain made ahead has run or is queued
            # before any forward that reuses them)
            self.bm.trim(st.shadow, max(st.usual_blocks * self.bm.block_size,
                                        start + hidden.shape[0]))
            st.last_hidden = ahead.hidden[row]
            budgets = ahead.budgets[row]
            rows[seq.request_id] = (row, seq.num_tokens, budgets[hidden.shape[0] - 1])
        self._ahead_drafts = (ahead.drafts, rows) if rows and ahead.drafts is not None else None
        return rest

    # ---- drafting ------------------------------------------------------------------------------
    def propose(self, seqs: list[Sequence], allowed: bool | None = None) -> None:
        self.pending = None   # a step that drafts nothing must not patch last step's drafts
        super().propose(seqs, allowed)
        self._ahead_drafts = None   # drafts made ahead serve this step or none

    @torch.inference_mode()
    def draft(self, work: list[tuple[Sequence, int]]) -> None:
        if all(self._never_drafts(seq) for seq, _ in work):
            return   # (an overlapped step's propose: only sequences that never draft again)
        self.catch_up()   # the MTP cache must hold every position before drafting from it
        active = []
        for seq, budget in work:
            st = self.states.get(seq.request_id)
            if st is not None and not st.broken and st.last_hidden is not None \
                    and st.shadow.num_computed_tokens == seq.num_tokens - 1:
                active.append((seq, budget, st))
        if not active:
            return
        if self.use_chain and (not self.sampled_drafts
                               or all(seq.params.greedy for seq, _, _ in active)):
            self._draft_greedy(active)
        else:
            self._draft_loop(active)
        for seq, _, st in active:
            st.shadow.token_ids = seq.token_ids[1:]
            st.shadow.num_computed_tokens = seq.num_tokens - 1   # chained K/V is not kept

    def _draft_greedy(self, active) -> None:
        """Greedy drafts left on the device (spec/pending_drafts.py), no host sync: those the
        last verify step made ahead where it made them (draft_ahead.py), one chain (mtp_chain.py,
        on CUDA one graph replay) for the others (sequences just out of prefill, ones the last
        step left out)."""
        rows = self._ahead_rows(active)
        if any(r is not None for r in rows):
            # shadow blocks for every row's chain as the usual chain takes them, in its order
            # (the read-back gave back those taken ahead): cut where it would be cut
            plan = [ChainRow(st.shadow.block_table, seq.num_tokens, budget)
                    for seq, budget, st in active]
            self._allocate_chain(active, plan)
            active = [(seq, r.budget, st) for (seq, _, st), r in zip(active, plan)]
        made = [a for a, r in zip(active, rows) if r is not None]
        rest = [a for a, r in zip(active, rows) if r is None]
        parts, budgets = [], [budget for _, budget, _ in made]
        if made:
            ahead = _take(self._ahead_drafts[0], [r for r in rows if r is not None])
            # a view of a chain graph's static output: the replay below may overwrite it
            parts.append(ahead.clone() if rest else ahead)
        if rest:
            drafts, cut = self._chain_drafts(rest)
            parts.append(drafts)
            budgets += cut
        self.pending = PendingDrafts(_stack_rows(parts), [seq for seq, _, _ in made + rest],
                                     budgets)

    def _chain_drafts(self, active) -> tuple[torch.Tensor, list[int]]:
        """Greedy drafts [B, m] int64 of ``active`` from one layout and (on CUDA) one graph
        replay, and each row's budget (cut where the shadow pool ran out of blocks)."""
        rows = [ChainRow(st.shadow.block_table, seq.num_tokens, budget)
                for seq, budget, st in active]
        self._allocate_chain(active, rows)
        hidden = torch.stack([st.last_hidden for _, _, st in active])
        return self.chain.run(hidden, rows, max(r.budget for r in rows)), [r.budget for r in rows]

    def _ahead_rows(self, active: list[tuple[Sequence, int, _MTPState]]) -> list[int | None]:
        """Per active sequence, its row in the drafts the last verify step made ahead
        (draft_ahead.py) when it made them at the sequence's current length and planned at
        least the budget asked (steps past a row's plan are dead: never proposed), else None."""
        if self._ahead_drafts is None:
            return [None] * len(active)
        made = self._ahead_drafts[1]
        rows = []
        for seq, budget, _ in active:
            r = made.get(seq.request_id)
            ok = r is not None and r[1] == seq.num_tokens and budget <= r[2]
            rows.append(r[0] if ok else None)
        return rows

    def patch_inputs(self, batch, sched) -> None:
        if self.pending is not None:
            self.pending.patch(batch, sched)

    def resolve_drafts(self, sched) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.resolve(sched)

    def _allocate_chain(self, active, rows: list[ChainRow]) -> None:
        """Shadow blocks for each row's chained steps, step after step in row order as the loop
        takes them; a row whose step s finds no free block keeps s drafts (``rows[i].budget``)."""
        for s in range(1, max(r.budget for r in rows)):
            for (seq, _, st), r in zip(active, rows):
                if r.budget > s and not self.bm.allocate(st.shadow, seq.num_tokens - 1 + s):
                    r.budget = s

    def _draft_loop(self, active) -> None:
        """Draft step after step, each chained step through ``runner.prepare``: drafts drawn
        from the MTP's processed distribution (``sampled_drafts``), or argmax ones with
        ``use_chain`` off (the reference for the chain)."""
        drafted = [seq for seq, _, _ in active]
        greedy = all(seq.params.greedy for seq in drafted)
        qs: dict[str, list[torch.Tensor]] = {seq.request_id: [] for seq in drafted}
        hidden = torch.stack([st.last_hidden for _, _, st in active])
        on_device = []   # greedy: each step's draft tokens [n] stay on the device until the end
        while active:
            if greedy:   # argmax without a host round trip; the next step reads it on the device
                ids = self.head.greedy(hidden)
                on_device.append(ids)
                tokens = [0] * len(active)   # placeholders, filled in below
            else:
                ids, (tokens, q) = None, self._sample(active, self.head.logits(hidden))
            still, rows = [], []
            for i, (seq, budget, st) in enumerate(active):
                seq.draft_token_ids = seq.draft_token_ids + [tokens[i]]
                if not greedy:
                    qs[seq.request_id].append(q[i])
                if len(seq.draft_token_ids) < budget:
                    still.append((seq, budget, st))
                    rows.append(i)
            active, hidden = (self._chain(still, _take(hidden, rows), _take(ids, rows))
                              if still else ([], None))
        if on_device:
            _fill_drafts(drafted, torch.cat(on_device).tolist())
        for seq in drafted:
            if not seq.params.greedy:
                seq.draft_probs = torch.stack(qs[seq.request_id])

    def _chain(self, active, hidden: torch.Tensor, draft_ids: torch.Tensor | None = None):
        """One chained MTP step for each active sequence: input (its previous MTP output, its
        newest draft) one position on. ``draft_ids`` [n] int64 on the device: those newest
        drafts when the host holds only placeholders. Returns the sequences that ran and their
        outputs."""
        sched, kept, rows = SchedulerOutput(), [], []
        for i, (seq, budget, st) in enumerate(active):
            sh = st.shadow
            sh.token_ids = seq.token_ids[1:] + seq.draft_token_ids
            if self.bm.allocate(sh, sh.num_tokens):
                sched.scheduled.append(ScheduledSeq(sh, 1, []))
                kept.append((seq, budget, st))
                rows.append(i)
        if not kept:
            return [], None
        y = self._forward(sched, _take(hidden, rows), step=len(kept[0][0].draft_token_ids),
                          input_ids=_take(draft_ids, rows))
        for _, _, st in kept:
            st.shadow.num_computed_tokens += 1
        return kept, y

    def _sample(self, active, logits: torch.Tensor):
        rows = [SamplingRow(_GREEDY if seq.params.greedy else seq.params, st.generator,
                            seq.prompt_token_ids, seq.output_token_ids + seq.draft_token_ids,
                            self.eos) for seq, _, st in active]
        q = self.sampler.probs(self.sampler.process_logits(logits, rows), rows)
        return self.sampler.draw(q, rows).tolist(), q

    def capture_cuda_graphs(self) -> None:
        """Capture the MTP forwards once at start, like the target's, nothing off CUDA: the
        observe forwards (one MTP layer; see mtp_graph.py) and the greedy draft chain per
        (sequences, drafts) (mtp_chain_graph.py)."""
        r = self.runner
        if r.device.type != "cuda":
            return
        if len(self.mtp.layers) == 1:
            from mtpserve.spec.mtp_graph import MTPGraphRunner

            r.capture_cuda_graphs(MTPGraphRunner)
        from mtpserve.spec.mtp_chain_graph import ChainGraphs

        graphs = ChainGraphs(self.chain, r.config.max_num_seqs,
                             -(-r.max_model_len // r.block_size), self.k)
        graphs.capture()
        self.chain.graphs = graphs
        self.compile_observe_shapes()

    @torch.inference_mode()
    def compile_observe_shapes(self) -> int:
        """Compile ahead (kernels/compile_ahead.py) the Triton kernels of the eager observe
        forward in the layouts of mtp_compile.py, up to the longest catch-up (a backlog of up
        to ``max_num_batched_tokens`` positions plus one step of as many), as far as the free
        shadow blocks hold dummy sequences. A catch-up observes a backlog of any length, and
        each specialization compiled at its first use stalled that step by up to 1.7 s on the
        H200 (benchmarks/gpu_mtp_catchup.py). Returns the dry forwards run (0: this Triton
        cannot compile ahead, or no block is free)."""
        free, bs, cfg = self.bm.num_free_blocks, self.bm.block_size, self.runner.config
        per_seq = min(self.runner.max_model_len - 1, free * bs)
        max_seqs = min(cfg.max_num_seqs, free // max(1, -(-per_seq // bs)))
        longest = min(self.backlog.max_tokens + cfg.max_num_batched_tokens, per_seq * max_seqs)
        layouts = observe_layouts(longest, per_seq, max_seqs)
        if not layouts:
            return 0
        seqs = [Sequence(f"__compile_{i}__", [0] * per_seq, SamplingParams(), (),
                         self.runner.max_model_len, None, None)
                for i in range(max(len(parts) for parts in layouts))]
        with compiling_ahead() as ahead:
            if not ahead:
                return 0
            try:
                if not all(self.bm.allocate(seq, per_seq) for seq in seqs):
                    return 0
                for parts in layouts:
                    self._dry_observe(seqs, parts)
            finally:
                for seq in seqs:
                    self.bm.free_seq(seq)
        # the dry forwards wrote K/V computed from uninitialised memory: the pool must be all
        # zeros again (kv_cache.py: padded rows read it, and 0 * NaN would poison them)
        self.runner.kv_cache.tensor.zero_()
        return len(layouts)

    def _dry_observe(self, seqs: list[Sequence], parts: list[int]) -> None:
        """One observe forward of ``parts[i]`` positions of ``seqs[i]`` from position 0, on zero
        hidden states and ids (a dry run under compiling_ahead: its KV lands in blocks that are
        given back)."""
        sched = SchedulerOutput([ScheduledSeq(s, n, []) for s, n in zip(seqs, parts)])
        n = sum(parts)
        hidden = torch.zeros(n, self.target.config.hidden_size, device=self.runner.device,
                             dtype=self.runner.dtype)
        self._forward(sched, hidden, input_ids=torch.zeros(n, dtype=torch.int64,
                                                           device=self.runner.device))

    def _forward(self, sched: SchedulerOutput, hidden: torch.Tensor, step: int = 0,
                 input_ids: torch.Tensor | None = None):
        batch, _ = self.runner.prepare(sched)
        if input_ids is not None:   # into the batch's own ids: they stay a view of token_io
            batch.input_ids.copy_(input_ids)
        hidden = hidden.to(self.runner.dtype)
        graphs = self.runner.graphs
        if graphs is not None and graphs.can_run(batch):
            return graphs.run(batch, hidden)
        return self.mtp(batch.input_ids, hidden, batch, step=step)

    # ---- bookkeeping ---------------------------------------------------------------------------
    def _state(self, seq: Sequence) -> _MTPState:
        st = self.states.get(seq.request_id)
        if st is None:
            shadow = Sequence(seq.request_id, seq.token_ids[1:], SamplingParams(), (),
                              seq.max_model_len, None, None)
            seed = seq.params.seed
            gen = make_generator(None if seed is None else seed + DRAFT_SEED_OFFSET,
                                 self.runner.device)
            st = self.states[seq.request_id] = _MTPState(shadow, None, gen)
        return st

    def _break(self, st: _MTPState) -> None:
        st.broken, st.last_hidden = True, None
        self.bm.free_seq(st.shadow)

    def drafts_nothing(self, seqs: list[Sequence], allowed: bool) -> bool:
        """As Proposer's, leaving out sequences whose MTP state broke: they never draft again
        (else every step the gate allows them would drain the pipeline for nothing)."""
        states = self.states
        return super().drafts_nothing(
            [s for s in seqs if not ((st := states.get(s.request_id)) and st.broken)], allowed)

    def _never_drafts(self, seq: Sequence) -> bool:
        """``seq``'s MTP state broke for good (the shadow fell out of step or found no block),
        or the policy benched it."""
        st = self.states.get(seq.request_id)
        return (st is not None and st.broken) or self._benched(seq)

    def _observable(self, seqs: list[Sequence]) -> set[int]:
        """The ``id`` of each sequence of ``seqs`` the MTP observes: all but those the policy
        benched (spec/shared_acceptance.py), found in one pass (they never draft, so they get
        no state, no blocks and no catch-up)."""
        return {id(s) for s in self._unbenched(seqs)}

    def _benched(self, seq: Sequence) -> bool:
        """The policy benched ``seq`` (spec/shared_acceptance.py): never observed, never drafts."""
        benched = getattr(self.policy, "benched", None)   # (a policy of one's own may lack it)
        return benched is not None and benched(seq)

    def release(self, seq: Sequence) -> None:
        super().release(seq)
        st = self.states.pop(seq.request_id, None)
        if st is not None:
            self.bm.free_seq(st.shadow)
        if not self.states:   # nothing left to observe: drop the hidden states kept for it
            self.backlog.take()


def _take(x: torch.Tensor | None, rows: list[int]) -> torch.Tensor | None:
    """``x[rows]`` along dim 0 without a host sync: nothing when every row is kept (the usual
    case), else an index uploaded from pinned memory (indexing a CUDA tensor with a Python list
    blocks until the device is idle)."""
    if x is None or rows == list(range(x.shape[0])):
        return x
    return x.index_select(0, to_device(rows, torch.int64, x.device))


def _stack_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """[n_i, m_i] draft tensors one under the other, narrower ones padded with zeros to the
    widest (a row's budget never reaches its padding)."""
    if len(parts) == 1:
        return parts[0]
    m = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, m - p.shape[1])) for p in parts])


def _fill_drafts(drafted: list[Sequence], tokens: list[int]) -> None:
    """Replace the greedy drafting loop's placeholders: ``tokens`` holds, step after step, the
    draft of every sequence still drafting at that step, in order (the loop's ``active``; a
    sequence leaves once it has its budget, so each step's sequences are a prefix-ordered
    subset of the one before)."""
    pos = {seq.request_id: 0 for seq in drafted}
    step = list(drafted)
    it = iter(tokens)
    while step:
        nxt = []
        for seq in step:
            i = pos[seq.request_id]
            seq.draft_token_ids[i] = next(it)
            pos[seq.request_id] = i + 1
            if i + 1 < len(seq.draft_token_ids):
                nxt.append(seq)
        step = nxt
