"""How many draft tokens a request should verify this step, so that speculation never costs more
than it saves.

Model (Leviathan et al. 2023, sec. 3.3): if each draft token is accepted with probability a
independently, verifying m drafts emits E(m) = (1 - a^(m+1)) / (1 - a) tokens, and the step costs
C(m) = 1 + (alpha + beta) * m decode steps, where alpha is the target's extra cost per verified
token (small when decoding is memory-bound) and beta the proposer's cost per draft. On a GPU with
CUDA graphs the target's part is measured instead: C(m) = t(B (1 + m), B) / t(B, B) + beta * m,
with t(n, B) the replay time of the step graph for n tokens plus the learned host time of B
sequences carrying n - B drafts (engine/step_timer.py), B the sequences decoding together, so
at high load, where a step of B (1 + m) tokens is compute-bound, drafting stops paying and stops.
The policy picks the m in 0..k that maximises E(m) / C(m); m = 0 means plain decoding.

a is estimated per request from its own verify steps with exponential forgetting: each step that
verified m drafts and accepted j adds j successes out of j + (1 if j < m else 0) trials (the
maximum-likelihood count for a truncated geometric). Before any evidence the estimate starts at the
acceptance pooled over earlier requests (shared_acceptance.py; ``prior`` while there is none); while
a request does not draft, its estimate slowly returns there, so that it tries again later. A request
that starts priced out (no m pays at batch 1's price nor the step's: measured where they are, the
cost model's before) is benched for good, unless it is that module's scout, which drafts until its
first verify even on steps the load gate vetoes (no other request drafts on those), priced by the
cost model until then. Priced out at the model's price alone, a pool between that price and the
measured one (e.g. after a spell of rejected drafts) benched nobody and sent no scout, while no
request's estimate paid the measured price: nothing drafted, so the pool never heard that drafts
paid again (session 16: benchmarks/cpu_policy_sim.py --measured-prices).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpserve.engine.sequence import Sequence
from mtpserve.spec.load_gate import LoadGate
from mtpserve.spec.shared_acceptance import SharedAcceptance


@dataclass(frozen=True)
class GateArm:
    """The load gate's decision on one decode step (spec/load_gate.py), kept with the step until
    its outcome is recorded (under async scheduling, a later step's): ``drafting``, the gate let
    it draft (its sequences then draft what the policy gives them, maybe nothing); ``switch``,
    it let this step draft and vetoed the decode step before (or there was none);
    ``scouts_only``, it vetoed, and only open scouts may draft."""

    drafting: bool
    switch: bool
    scouts_only: bool


@dataclass
class _Estimate:
    successes: float
    trials: float
    benched: bool = False   # started priced out: never drafts (shared_acceptance.py)
    scout: bool = False     # started priced out but drafts (shared_acceptance.py)
    hits: int = 0           # its own evidence, undecayed and without the prior: successes
    tries: int = 0          # ... and trials

    @property
    def open_scout(self) -> bool:
        """A scout that has verified no draft yet (it may draft where the gate vetoes)."""
        return self.scout and self.tries == 0


class DraftLengthPolicy:
    """Per-request draft length.

    Args:
        k: most drafts per step. cost_per_draft: alpha + beta above (in decode steps), used when
        nothing is measured; step_cost: ``(tokens, sequences) -> seconds | None`` (measured
        target steps);
        draft_cost: beta alone, added to the measured ratio until ``drafts_measured()`` says
        the measured steps with drafts include the proposer's time (the step timer times
        whole steps: adding beta then would count the proposer twice);
        prior: acceptance estimate before any evidence; prior_weight: a request's starting
        estimate's weight in trials (the pooled estimate's prior weighs twice that);
        decay: forgetting factor per verify step; gate: the measured veto by batch size
        (load_gate.py), None for none; shared: the acceptance pooled over requests
        (shared_acceptance.py); None: every request starts at ``prior``, none is benched.
    """

    def __init__(self, k: int, cost_per_draft: float, prior: float = 0.6,
                 prior_weight: float = 2.0, decay: float = 0.8, step_cost=None,
                 draft_cost: float = 0.0, gate: LoadGate | None = None,
                 drafts_measured=None, shared: SharedAcceptance | None = None):
        self.shared = shared
        self.gate = gate
        self.drafts_measured = drafts_measured   # () -> bool, or None: never
        self.k, self.cost, self.draft_cost = k, cost_per_draft, draft_cost
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self.step_cost = step_cost  # measured seconds of a target step, or None
        self.batch = 1
        self._costs: list[float] | None = None   # this step's C(m), m = 0..k
        self._exploring = False   # this step measures drafting: priced by the model
        self._scouts_only = False   # the gate vetoed this step: only open scouts draft
        self._allowed = False       # the gate's say on this step
        self._open_scouts = 0       # scouts that have verified no draft yet
        self._last_drafting = False   # step_arm's last decision: the gate let that step draft
        self._est: dict[str, _Estimate] = {}

    def set_batch(self, num_seqs: int) -> None:
        """Sequences decoding together this step (prices the verify step when costs are
        measured). Starts a new step: its costs are priced once, on first use, for all of its
        sequences (per sequence they cost ~2k graph-table look-ups: 2-3 ms of host time per step
        at 64 requests on the H200, which made n-gram speculation 0.6x there without a draft)."""
        self.batch = max(1, num_seqs)
        self._costs, self._exploring, self._scouts_only = None, False, False

    def allow_drafts(self) -> bool:
        """Whether this step (``set_batch`` sequences) may draft at all (the gate's say). On
        a step the gate lets draft to measure drafting (``LoadGate.exploring``), drafts are
        priced by the model (``cost_per_draft``), not by the measured step times: a measured
        price that went stale (a slow first step) would else keep every request from drafting,
        hence from being measured again. Where the gate vetoes, a scout that has verified no
        draft yet drafts anyway, priced by the model, and no other request does: a scout is the
        pool's only way to hear that drafts pay again, and once the pool is priced out and the
        gate vetoes, nothing else drafts, so neither would ever hear it (a fresh review's
        finding, session 15: benchmarks/cpu_policy_sim.py)."""
        if self.gate is None:
            return True
        allowed = self._allowed = self.gate.allow(self.batch)
        exploring = getattr(self.gate, "exploring", None)   # (a gate of one's own may lack it)
        self._exploring = allowed and exploring is not None and exploring(self.batch)
        self._scouts_only = not allowed and self._open_scouts > 0
        self._exploring = self._exploring or self._scouts_only
        self._costs = None
        return allowed or self._scouts_only

    def step_arm(self) -> GateArm | None:
        """Right after :meth:`allow_drafts`: the gate's decision on this step, to be handed back
        with the step's outcome (:meth:`record_step`); None without a gate."""
        if self.gate is None:
            return None
        last, self._last_drafting = self._last_drafting, self._allowed
        return GateArm(self._allowed, self._allowed and not last, self._scouts_only)

    def reset_switch(self) -> None:
        """A step ran without asking the gate (prefills alone), or the engine idled: the next
        step it lets draft is a switch, drafting from scratch (the MTP without drafts made
        ahead, catching up on the prompt; a draft model prefilling its copy of it; n-gram
        indexing it)."""
        self._last_drafting = False

    def record_step(self, num_seqs: int, arm: GateArm | None, tokens: int, seconds: float,
                    synchronous: bool) -> None:
        """The outcome of a decode step of ``num_seqs`` sequences that the gate decided ``arm``
        on (:meth:`step_arm`): ``tokens`` emitted in ``seconds`` of the engine's wall time
        (engine.py ``_record_for_policy``); ``synchronous``: it ran without async scheduling.

        The gate learns what each of its decisions yields, not what the step happened to do: a
        step it let draft is the drafting arm's whether or not any sequence had drafts. Filed by
        whether drafts were verified, an n-gram proposer's steps were picked by their own text:
        the drafting arm heard only runs of matching steps (2300-2500 tok/s), the step after
        one without drafts (a switch, unrecorded) being 40% of n-gram's drafting steps in chat,
        while the synchronous steps that found no match slowed the plain arm (1100-1400 tok/s
        against ~1700 overlapped): the gate let chat draft at 0.90x plain decoding on the real
        SmolLM2 at one request (H100, session 37; 0.98x filed by decision). The step's own
        size, not the last ``set_batch``: under async scheduling a plain step is read back while
        a later step, of another size, is already decided. A step on which only open scouts
        could draft (the gate had vetoed it: :meth:`allow_drafts`) is not the gate's to learn
        from unless it ran as plain steps do (overlapped): one row of 64 drafting says nothing
        of the whole batch drafting (a fresh review found two such steps turning a 4.5x loss
        into a win)."""
        if self.gate is None or arm is None or (arm.scouts_only and synchronous):
            return
        self.gate.record(max(1, num_seqs), arm.drafting, tokens, seconds, switch=arm.switch)

    def _relative_cost(self, m: int) -> float:
        """Cost of a step where every sequence verifies m drafts, over a plain decode step."""
        return self._price(m, self.batch, measured=not self._exploring)

    def _price(self, m: int, b: int, measured: bool) -> float:
        """C(m) for ``b`` sequences: from the measured step times where ``measured`` and they
        exist, else the cost model's ``1 + cost_per_draft * m``."""
        base = self.step_cost(b, b) if self.step_cost is not None and measured else None
        if base:
            spec = self.step_cost(b * (1 + m), b)
            if not spec:
                return float("inf")   # past the largest measured step: not worth risking
            measured = self.drafts_measured is not None and self.drafts_measured()
            return spec / base + (0.0 if measured else self.draft_cost * m)
        return 1 + self.cost * m

    def acceptance(self, seq: Sequence) -> float:
        e = self._seen(seq)
        return e.successes / e.trials

    def benched(self, seq: Sequence) -> bool:
        """Whether ``seq`` sits out speculation for good: it started priced out and is no scout
        (shared_acceptance.py). Decided at the policy's first sight of ``seq``."""
        return self._seen(seq).benched

    def unbenched(self, seqs: list[Sequence]) -> list[Sequence]:
        """The sequences of ``seqs`` not benched, in order: one pass for a step's per-sequence
        checks (a server whose requests are all benched then spends ~nothing on them)."""
        est = self._est
        return [s for s in seqs if not (est.get(s.request_id) or self._seen(s)).benched]

    def _sits_out(self, seq: Sequence) -> bool:
        """``seq`` drafts nothing this step whatever its acceptance: benched, or not an open
        scout on a step only those may draft (:meth:`allow_drafts`)."""
        e = self._seen(seq)
        return e.benched or (self._scouts_only and not e.open_scout)

    def num_drafts(self, seq: Sequence) -> int:
        """Best m in 0..k for this request now."""
        if self._sits_out(seq):
            return 0
        best = self._best(self.acceptance(seq), self._seen(seq).open_scout)
        if best == 0:  # not drafting: drift back towards the pooled acceptance, to try again
            self._update(seq, 0, 0, idle=True)
        return best

    def would_draft(self, seq: Sequence) -> int:
        """What :meth:`num_drafts` answers for ``seq`` now, without its side effect (the drift
        towards the pooled acceptance of a request that does not draft)."""
        return (0 if self._sits_out(seq)
                else self._best(self.acceptance(seq), self._seen(seq).open_scout))

    def num_drafts_after(self, seq: Sequence, num_drafts: int, num_accepted: int) -> int:
        """What :meth:`num_drafts` will answer for ``seq`` once a verify step of ``num_drafts``
        drafts that accepted ``num_accepted`` is recorded, priced at this step's batch size;
        changes nothing (drafting ahead plans the next drafts before the step is read back:
        spec/draft_ahead.py)."""
        e = self._seen(seq)
        if e.benched:
            return 0
        if num_drafts:
            e = _updated(e, num_drafts, num_accepted, self.decay)
        return self._best(e.successes / e.trials, e.open_scout)

    def _best(self, acceptance: float, model_price: bool = False) -> int:
        """The m in 0..k of the highest E(m) / C(m) at this step's costs (``model_price``:
        at the cost model's, as an open scout drafts)."""
        a = min(acceptance, 0.999)
        if self._costs is None:
            self._costs = [1.0] + [self._relative_cost(m) for m in range(1, self.k + 1)]
        costs = ([self._price(m, 1, measured=False) for m in range(self.k + 1)] if model_price
                 else self._costs)
        best, best_rate = 0, 1.0
        for m in range(1, self.k + 1):
            rate = (1 - a ** (m + 1)) / (1 - a) / costs[m]
            if rate > best_rate:
                best, best_rate = m, rate
        return best

    def record(self, seq: Sequence, num_drafts: int, num_accepted: int) -> None:
        if num_drafts:
            self._update(seq, num_drafts, num_accepted)
            if self.shared is not None:
                self.shared.record(num_drafts, num_accepted)

    def forget(self, seq: Sequence) -> None:
        """``seq`` finished: its estimate goes; a scout's tells the pool whether drafts paid."""
        e = self._est.pop(seq.request_id, None)
        if e is None or not e.scout:
            return
        if e.open_scout:   # no evidence: the interval stays
            self._open_scouts -= 1
        else:              # its own evidence decides
            self.shared.scout_done(not self.priced_out(e.hits / e.tries))

    def pooled(self) -> float:
        """The acceptance pooled over requests (shared_acceptance.py), ``prior`` before any."""
        if self.shared is None:
            return self.prior
        return self.shared.estimate(self.prior, 2 * self.prior_weight)

    def priced_out(self, acceptance: float, measured: bool = True) -> bool:
        """Whether no m in 1..k pays at ``acceptance`` at the lower of batch 1's price and the
        current step's (a fixed drafting overhead per step weighs least at high load, a verify
        of B (1 + m) tokens most): the measured ones where they exist and ``measured``, else
        the cost model's (``1 + cost_per_draft * m`` plain steps)."""
        a = min(acceptance, 0.999)
        sizes = {1, self.batch}
        return all((1 - a ** (m + 1)) / (1 - a) <= min(self._price(m, b, measured) for b in sizes)
                   for m in range(1, self.k + 1))

    def _seen(self, seq: Sequence) -> _Estimate:
        """``seq``'s estimate, started at first sight (:meth:`_start`)."""
        e = self._est.get(seq.request_id)
        if e is None:
            e = self._est[seq.request_id] = self._start()
        return e

    def _start(self) -> _Estimate:
        """A new request's estimate: the pooled acceptance; benched when that is priced out,
        unless the request is a scout, which starts from ``prior``."""
        a, w = self.pooled(), self.prior_weight
        if self.shared is not None and self.priced_out(a):
            if not self.shared.scout(can_draft=not self.priced_out(self.prior, measured=False)):
                return _Estimate(a * w, w, benched=True)
            self._open_scouts += 1
            return _Estimate(self.prior * w, w, scout=True)
        return _Estimate(a * w, w)

    def _update(self, seq: Sequence, m: int, j: int, idle: bool = False) -> None:
        e = self._seen(seq)
        if idle:
            w = 1 - self.decay ** 0.25
            e.successes += w * (self.pooled() * e.trials - e.successes)
            return
        if e.open_scout:
            self._open_scouts -= 1   # its first verify: it has evidence now
        self._est[seq.request_id] = _updated(e, m, j, self.decay)


def _updated(e: _Estimate, m: int, j: int, decay: float) -> _Estimate:
    """``e`` after a verify step of m drafts that accepted j (see the module doc)."""
    trials = j + (1 if j < m else 0)
    return _Estimate(decay * e.successes + j, decay * e.trials + trials, e.benched, e.scout,
                     e.hits + j, e.tries + trials)
