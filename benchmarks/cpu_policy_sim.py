"""The draft-length policy, load gate and pooled acceptance under a made-up load, without a model.

Drives ``DraftLengthPolicy`` + ``LoadGate`` + ``SharedAcceptance`` (spec/) through phases of
steps the way the engine calls them: ``set_batch`` / ``allow_drafts`` per step, a new request
first seen after its prefill step (as the MTP observes it), ``num_drafts`` and ``record`` per
verify, ``record_step`` per all-decode step, ``forget`` when a request ends. Each draft is
accepted with the phase's probability; step times come from a linear model (plain step
``--plain-ms`` + ``--per-seq-ms`` per sequence; a drafting step that much times 1 + 0.1 per draft,
plus ``--draft-overhead-ms``, plus ``--switch-ms`` after a plain step), not from a GPU; the
policy prices drafts by ``--cost-per-draft``, or with ``--measured-prices`` by those step
times, as the engine does with CUDA graphs, or with ``--step-timer`` as the engine learns them:
the model's time without the drafting overhead stands for the graph's replay, the rest is host
time learned by the engine's own StepTimer (engine/step_timer.py) on the simulated clock.
``--match P`` lets a sequence draft on a step that may draft only with probability P (an n-gram
proposer without a match drafts nothing: that step is plain, costing ``--sync-ms`` more than a
plain step, since it runs synchronously). ``--arms drafted`` files steps under the gate's arms
as session 36's engine did (by whether they verified drafts, a drafting step after one that did
not being a switch) instead of by the gate's decision. Made to
try rules for scouts and the gate's probes on the CPU before spending device time on them
(session 15: a rule that stopped scouts where the gate vetoes turned out to switch speculation
off for good; a fresh review found it with the first version of this script).

    python benchmarks/cpu_policy_sim.py --phases 1:0.9:2000 64:0:3000 1:0:3000 1:0.9:20000

Each phase is ``LOAD:ACCEPT:STEPS[:OVERHEAD_MS]`` (running requests, per-draft acceptance, engine
steps, and a drafting overhead other than ``--draft-overhead-ms``, e.g. a slow spell of the host);
ACCEPT ``=J`` accepts exactly the first J drafts of every verify (as ``gpu_mtp_speedup.py`` forces
them), else each draft is accepted with that probability. Prints, per phase: decode tokens/s under
the step-time model, steps, drafting steps, requests started (normal / scout / benched), scout steps
(a scout decoding in a step: the MTP observes it), the pooled acceptance, the gate's measured
tokens/s at batch 1 (drafting, plain) and the scout interval.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass, field

from mtpserve.engine.sequence import Sequence
from mtpserve.engine.step_timer import StepTimer
from mtpserve.sampling_params import SamplingParams
from mtpserve.spec.load_gate import LoadGate
from mtpserve.spec.policy import DraftLengthPolicy
from mtpserve.spec.shared_acceptance import SharedAcceptance


@dataclass
class Phase:
    """``load`` running requests, each draft accepted with probability ``accept``, ``steps``;
    ``overhead_ms``: this phase's drafting overhead (None: ``--draft-overhead-ms``)."""

    load: int
    accept: float
    steps: int
    fixed: int | None = None   # ACCEPT "=J": the first J drafts accepted, the rest rejected
    overhead_ms: float | None = None

    @classmethod
    def parse(cls, text: str) -> "Phase":
        load, accept, steps, *overhead = text.split(":")
        over = float(overhead[0]) if overhead else None
        if accept.startswith("="):
            return cls(int(load), 0.0, int(steps), int(accept[1:]), over)
        return cls(int(load), float(accept), int(steps), overhead_ms=over)

    def accepted(self, m: int, rng: random.Random) -> int:
        """Drafts accepted of ``m`` verified."""
        if self.fixed is not None:
            return min(m, self.fixed)
        j = 0
        while j < m and rng.random() < self.accept:
            j += 1
        return j


@dataclass
class Counts:
    steps: int = 0
    draft_steps: int = 0
    normal: int = 0
    scouts: int = 0
    benched: int = 0
    scout_steps: int = 0
    tokens: int = 0         # emitted by the timed steps (decode steps without a prefill)
    seconds: float = 0.0    # their modelled time


@dataclass
class Sim:
    """The policy under simulation and the requests in flight (``out``: tokens emitted)."""

    policy: DraftLengthPolicy
    args: argparse.Namespace
    rng: random.Random
    running: list = field(default_factory=list)
    out: dict = field(default_factory=dict)
    made: int = 0
    prev_drafted: bool = False
    arm: object = None        # the gate's decision on this step (policy.py GateArm)
    clock: float = 0.0        # simulated seconds so far (the step timer's clock)
    timer: StepTimer | None = None

    def new_request(self) -> Sequence:
        self.made += 1
        seq = Sequence(f"r{self.made}", [1, 2, 3], SamplingParams(), (), 1 << 20, None, None)
        self.out[seq.request_id] = 1   # its prefill step sampled the first token
        return seq

    def seconds(self, batch: int, drafts: int, drafted: bool, phase: Phase) -> float:
        return self.model_seconds(self.args, batch, drafts, drafted, self.prev_drafted,
                                  phase.overhead_ms)

    @staticmethod
    def model_seconds(a: argparse.Namespace, batch: int, drafts: int, drafted: bool,
                      after_drafting: bool, overhead_ms: float | None = None) -> float:
        """The made-up step time (module doc), seconds."""
        plain = Sim.device_seconds(a, batch, 0)
        if not drafted:
            return plain
        switch = 0.0 if after_drafting else a.switch_ms / 1e3
        over = a.draft_overhead_ms if overhead_ms is None else overhead_ms
        return Sim.device_seconds(a, batch, drafts) + over / 1e3 + switch

    @staticmethod
    def device_seconds(a: argparse.Namespace, batch: int, drafts: int) -> float:
        """The part of a step of ``drafts`` per sequence that stands for the graph's replay."""
        return (a.plain_ms + a.per_seq_ms * batch) / 1e3 * (1 + 0.1 * drafts)

    def drafts(self, decoding: list[Sequence]) -> dict[str, int]:
        """Drafts per request this step, as ``Proposer.propose`` decides them."""
        pol, k, length = self.policy, self.args.k, self.args.output_len
        self.arm = None
        if not decoding:   # as LLMEngine.step: no gate without decoding
            return {}
        allowed = pol.allow_drafts()
        self.arm = pol.step_arm()
        if not allowed:
            return {}
        out = {}
        for seq in pol.unbenched(decoding):
            # an n-gram proposer finding no match (no draw at 1: earlier runs' streams stay)
            if self.args.match < 1 and self.rng.random() >= self.args.match:
                continue
            m = min(k, length - self.out[seq.request_id] - 1)
            m = min(m, pol.num_drafts(seq)) if m > 0 else 0
            if m:
                out[seq.request_id] = m
        return out

    def step(self, phase: Phase, counts: Counts) -> None:
        pol, est = self.policy, self.policy._est
        prefill = [self.new_request() for _ in range(phase.load - len(self.running))]
        decoding = list(self.running)
        pol.set_batch(len(decoding))
        drafts = self.drafts(decoding)
        emitted = 0
        for seq in decoding:
            m = drafts.get(seq.request_id, 0)
            j = phase.accepted(m, self.rng)
            if m:
                pol.record(seq, m, j)
            self.out[seq.request_id] += 1 + j
            emitted += 1 + j
        drafted = bool(drafts)
        if decoding and not prefill:
            most = max(drafts.values(), default=0)
            secs = self.seconds(len(decoding), most, drafted, phase)
            # a step the gate let draft runs synchronously even where nothing matched
            synchronous = drafted or (self.arm is not None and self.arm.drafting)
            if synchronous and not drafted:
                secs += self.args.sync_ms / 1e3
            self.clock += secs
            if self.timer is not None:   # as the engine records a synchronous step
                self.timer.record(len(decoding) + sum(drafts.values()), len(decoding), secs,
                                  self.device_seconds(self.args, len(decoding), most),
                                  after_plain=not self.prev_drafted, num_drafting=len(drafts))
            if self.args.arms == "drafted":   # session 36's rule (module doc)
                if not (drafted and pol._scouts_only):
                    pol.gate.record(len(decoding), drafted, emitted, secs,
                                    switch=drafted and not self.prev_drafted)
            else:
                pol.record_step(len(decoding), self.arm, emitted, secs, synchronous)
            counts.tokens += emitted
            counts.seconds += secs
        if decoding:
            self.prev_drafted = drafted
        counts.steps += 1
        counts.draft_steps += drafted
        counts.scout_steps += sum(1 for s in decoding
                                  if (e := est.get(s.request_id)) is not None and e.scout)
        for seq in prefill:   # first sight after the prefill step starts its estimate
            pol.benched(seq)
            e = est[seq.request_id]
            kind = "benched" if e.benched else "scouts" if e.scout else "normal"
            setattr(counts, kind, getattr(counts, kind) + 1)
        self.running += prefill
        for seq in [s for s in self.running if self.out[s.request_id] >= self.args.output_len]:
            pol.forget(seq)
            self.running.remove(seq)
            del self.out[seq.request_id]


def build(args: argparse.Namespace, sim: Sim) -> DraftLengthPolicy:
    """The MTP's policy: its cost per draft, prior and pool (spec/__init__.py's defaults are
    not imported: the flags say them, so a run records what it assumed). With ``--step-timer``
    also the StepTimer it is priced by, on ``sim``'s clock, as spec/__init__.py wires it for
    an MTP (drafting time flat in m, the proposer's part of ``--cost-per-draft`` taken as 2/28
    until drafting steps are timed)."""
    step_cost, measured, beta = None, (lambda: True), 0.0
    if args.step_timer:
        timer = sim.timer = StepTimer(drafting_scales=False, max_age=args.max_age,
                                      clock=lambda: sim.clock)

        def step_cost(tokens: int, seqs: int) -> float:
            return (Sim.device_seconds(args, seqs, tokens // seqs - 1)
                    + timer.host_seconds(tokens, seqs))
        measured, beta = (lambda: timer.drafts_measured), 2.0 / 28
    elif args.measured_prices:   # what the step timer would have learned: the model's own times
        def step_cost(tokens: int, seqs: int) -> float:
            return Sim.model_seconds(args, seqs, tokens // seqs - 1, tokens > seqs, True)
    return DraftLengthPolicy(args.k, args.cost_per_draft, prior=args.prior, gate=LoadGate(),
                             shared=None if args.no_pool else SharedAcceptance(),
                             step_cost=step_cost, draft_cost=beta, drafts_measured=measured)


def report(i: int, phase: Phase, c: Counts, pol: DraftLengthPolicy) -> str:
    spec, plain = pol.gate.rates(1)
    rates = tuple(None if r is None else round(r) for r in (spec, plain))
    accept = phase.accept if phase.fixed is None else f"={phase.fixed}"
    return (f"phase {i} load {phase.load} accept {accept}: {c.tokens / c.seconds:.0f} tok/s; "
            f"steps {c.steps}, drafting "
            f"{c.draft_steps}; started normal {c.normal} / scout {c.scouts} / benched "
            f"{c.benched}; scout steps {c.scout_steps}; pooled "
            f"{'-' if pol.shared is None else f'{pol.pooled():.3f}'}; gate tok/s at 1 "
            f"(drafting, plain) {rates}; scout interval "
            f"{'-' if pol.shared is None else pol.shared.interval}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", nargs="+", type=Phase.parse, required=True,
                    metavar="LOAD:ACCEPT:STEPS")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--cost-per-draft", type=float, default=0.03 + 2.0 / 28,
                    help="the policy's model price per draft, in plain steps (default: an MTP "
                         "layer on a 28-layer model)")
    ap.add_argument("--prior", type=float, default=0.8)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--plain-ms", type=float, default=1.26)
    ap.add_argument("--per-seq-ms", type=float, default=0.05)
    ap.add_argument("--draft-overhead-ms", type=float, default=0.5)
    ap.add_argument("--switch-ms", type=float, default=2.8)
    ap.add_argument("--no-pool", action="store_true",
                    help="no pooled acceptance (no scouts, nothing benched): the n-gram "
                         "proposer's policy")
    ap.add_argument("--match", type=float, default=1.0,
                    help="probability that a sequence has drafts on a step that may draft (an "
                         "n-gram proposer drafts only where the recent tokens occurred before; "
                         "1: an MTP, which always has)")
    ap.add_argument("--sync-ms", type=float, default=0.0,
                    help="what a step the gate let draft but that drafted nothing (no match) "
                         "costs over a plain step: it runs synchronously, not overlapped")
    ap.add_argument("--arms", choices=("decision", "drafted"), default="decision",
                    help="file a step under the gate's decision on it (the engine's rule) or "
                         "under whether it verified drafts (session 36's rule)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measured-prices", action="store_true",
                    help="price drafts by the step-time model's own times, as the engine's step "
                         "timer and graph timings would (else by --cost-per-draft alone)")
    ap.add_argument("--step-timer", action="store_true",
                    help="price drafts as the engine learns them: the replay part of the model's "
                         "times plus host time learned by a StepTimer on the simulated clock")
    ap.add_argument("--max-age", type=float, default=10.0,
                    help="with --step-timer: seconds after which a drafting time is forgotten")
    args = ap.parse_args()
    sim = Sim(None, args, random.Random(args.seed))
    sim.policy = build(args, sim)
    for i, phase in enumerate(args.phases):
        counts = Counts()
        for _ in range(phase.steps):
            sim.step(phase, counts)
        print(report(i, phase, counts, sim.policy))


if __name__ == "__main__":
    main()
