"""Per-request speed of MTP drafting against plain decoding, for each number of drafts accepted.

Random weights accept (almost) nothing, so the acceptance is forced: the MTP engine drafts as
always (observe, chain, draft heads all run on the device), then the drafts it proposes are
replaced by the target's own greedy continuation (read from a plain engine over the same
weights), right for the first ``a`` and wrong after, so every verify step of k drafts accepts
exactly ``a`` and emits ``a + 1`` tokens. Batch 1, greedy, a prompt of 128 tokens, ``--new``
tokens per request, adaptive policy off: time per step (median over decode steps), tokens per
step, time per token and the speedup over plain decoding. ``--adaptive``: the policy on, as the
server runs by default; it drafts fewer (a step of m drafts accepts min(a, m)) or none where
drafts do not pay, so steps differ and time per token is total decode time over tokens; then
once more with drafting vetoed at every step (the MTP engine's cost when nothing drafts). In
bf16 the verify forward (1 + k rows) may break a near tie the other way than the decode forward:
the output is then compared with plain decoding and the first difference reported with plain
decoding's top-2 margin there, and the forcing follows the MTP engine's own output.

    python benchmarks/gpu_mtp_speedup.py [--shape qwen3-next-3b] [--k 3] [--json out.json]
    python benchmarks/gpu_mtp_speedup.py --shape tiny-qwen3-next --device cpu   # smoke run
"""

from __future__ import annotations

import argparse
import io
import json
import pstats
import statistics
import time
from typing import NamedTuple

import torch

from mtpserve.bench.random_model import random_model_files
from mtpserve.config import EngineConfig, SpeculativeConfig
from mtpserve.engine.engine import LLMEngine
from mtpserve.engine.forward_batch import to_device
from mtpserve.sampling_params import SamplingParams
from mtpserve.spec.load_gate import LoadGate
from mtpserve.spec.pending_drafts import PendingDrafts
from mtpserve.spec.shared_acceptance import SharedAcceptance

PROMPT = [(7 * j) % 500 + 2 for j in range(128)]


def build(shape: str, device: str, spec: SpeculativeConfig | None,
          max_num_seqs: int = 8) -> LLMEngine:
    dtype = "bfloat16" if device == "cuda" else "float32"
    cfg = EngineConfig(dtype=dtype, device=device, max_model_len=1024, max_num_seqs=max_num_seqs,
                       gpu_memory_utilization=0.4, speculative=spec)
    return LLMEngine(cfg, files=random_model_files(shape, device=device))


class Run(NamedTuple):
    """One request's tokens, median seconds per decode step, mean tokens per decode step, each
    token's top-1 minus top-2 logprob in nats (with ``logprobs``, else empty), all decode
    steps' seconds over their tokens, and each decode step's seconds."""

    tokens: list[int]
    step: float
    per_step: float
    margins: list[float]
    total_per_token: float
    times: list[float]


def run(eng: LLMEngine, new: int, logprobs: int | None = None) -> Run:
    """One greedy request through ``eng`` (``logprobs``: ask for the top 2, for margins)."""
    rid = f"r{time.monotonic_ns()}"
    eng.add_request(rid, PROMPT, SamplingParams(max_tokens=new, temperature=0.0,
                                                ignore_eos=True, logprobs=logprobs))
    times, emitted, tokens, margins = [], [], [], []
    while eng.has_unfinished_requests():
        decoding = not eng.scheduler.waiting and not any(s.in_prefill
                                                         for s in eng.scheduler.running)
        t = time.perf_counter()
        outs = eng.step()
        n = sum(len(o.new_token_ids) for o in outs)
        tokens += [t for o in outs for t in o.new_token_ids]
        margins += [lp.top[0][1] - lp.top[1][1] for o in outs for lp in o.new_logprobs or []]
        if decoding and n:
            times.append(time.perf_counter() - t)
            emitted.append(n)
    return Run(tokens, statistics.median(times), statistics.mean(emitted), margins,
               sum(times) / sum(emitted), times)


def policy_state(eng: LLMEngine, r: Run) -> dict:
    """What the adaptive policy saw after ``r``: its price C(m) of m drafts at batch 1 (decode
    steps), the step timer's host seconds, the gate's tokens/s per arm at batch 1, and the
    run's slowest and first decode steps (ms): where a draft got priced out."""
    policy, timer = eng.proposer.policy, eng.step_timer
    policy.set_batch(1)
    costs = [policy._relative_cost(m) for m in range(1, policy.k + 1)]
    gate = policy.gate.rates(1) if policy.gate is not None else None
    return dict(costs=costs, host_per_seq_ms=timer.host_per_seq * 1e3,
                host_per_drafting_seq_ms=[timer.host_per_drafting_seq(m) * 1e3
                                          for m in range(1, policy.k + 1)],
                drafts_measured=timer.drafts_measured, gate_tok_s=gate,
                slowest_ms=sorted((t * 1e3 for t in r.times), reverse=True)[:3],
                first_ms=[t * 1e3 for t in r.times[:4]])


def force_acceptance(eng: LLMEngine, reference: list[int], accept: int) -> None:
    """After each greedy drafting of ``eng``'s MTP proposer, propose ``reference`` (the greedy
    continuation of PROMPT) right for the first ``accept`` drafts and wrong after (a later call
    replaces the earlier one)."""
    p, vocab = eng.proposer, eng.model_config.vocab_size
    draft_greedy = type(p)._draft_greedy.__get__(p)   # the proposer's own, not an earlier wrap

    def forced(active):
        draft_greedy(active)   # the device work as always; its drafts are replaced
        seqs = [seq for seq, _, _ in active]
        budgets = [len(seq.draft_token_ids) for seq in seqs]
        width = max(budgets)
        rows = []
        for seq, b in zip(seqs, budgets):
            ref = reference[len(seq.output_token_ids):len(seq.output_token_ids) + b]
            row = [t if i < accept else (t + 1) % vocab for i, t in enumerate(ref)]
            rows += row + [0] * (width - len(row))
        drafts = to_device(rows, torch.int64, eng.device).view(len(seqs), width)
        p.pending = PendingDrafts(drafts, seqs, budgets)

    p._draft_greedy = forced


def forced_run(eng: LLMEngine, reference: list[int], accept: int, new: int,
               tries: int = 4) -> tuple[Run, list[int]]:
    """``run`` with ``accept`` drafts forced right per step. The drafts come from ``reference``;
    when the engine's own greedy output differs from it (a near tie that the verify forward's
    kernels, 1 + k rows, break the other way than the decode forward's in bf16), the forcing
    is redone from the engine's output until they agree, so every verify step accepts exactly
    ``accept``. Returns the run and the reference forced last.

    Raises:
        RuntimeError: no agreement after ``tries`` runs.
    """
    for _ in range(tries):
        force_acceptance(eng, reference, accept)
        r = run(eng, new)
        if r.tokens == reference:
            return r, reference
        reference = r.tokens
    raise RuntimeError(f"a={accept}: the forced output did not settle in {tries} runs")


def fresh_gate(eng: LLMEngine) -> None:
    """With ``--adaptive``: a new load gate (spec/load_gate.py) and a new pooled acceptance
    (spec/shared_acceptance.py) for each acceptance level, as a server that has seen only that
    acceptance. The gate is per batch size, not per request: after the drafts of one level lost
    to plain steps it vetoes drafting for the next level too, and its probes (one step in 32,
    blended in at weight 0.2) take ~100 steps to lift the veto (H200 run 8: 1.00 tokens per
    step at every level); the pool would bench the requests after a level that accepted
    nothing."""
    policy = eng.proposer.policy
    if policy is not None and policy.gate is not None:
        old = policy.gate
        policy.gate = LoadGate(old.probe_every, old.decay, old.max_probe_every,
                               old.probe_budget, old.probe_steps)
    if policy is not None:
        policy.shared = SharedAcceptance(policy.shared.decay, policy.shared.scout_every)


def vetoed(eng: LLMEngine, reference: list[int], margins: list[float], new: int,
           plain_step: float) -> dict:
    """The MTP engine with drafting vetoed at every step (what it costs when drafts do not
    pay: under async scheduling its plain steps overlap and the MTP keeps them in a backlog,
    spec/mtp_backlog.py): seconds per token against plain decoding's."""
    policy = eng.proposer.policy
    gate, policy.gate = policy.gate, _Every(None)
    try:
        r = run(eng, new)
    finally:
        policy.gate = gate
    row = dict(ms_per_token=r.total_per_token * 1e3, step_ms=r.step * 1e3,
               tokens_per_step=r.per_step, speedup=plain_step / r.total_per_token,
               **divergence(reference, r.tokens, margins))
    print(f"  drafting vetoed: {row['ms_per_token']:.3f} ms/token, {row['speedup']:.2f}x plain; "
          f"{row['note']}", flush=True)
    return row


def carry_over(eng: LLMEngine, reference: list[int], levels: list[int], requests: int,
               new: int, plain_step: float) -> list[dict]:
    """``requests`` requests at each forced acceptance level of ``levels`` in turn, the gate
    and the pooled acceptance kept from one level to the next (one fresh pair at the start):
    per level, time per token over its requests against plain decoding's, and per request
    the tokens per decode step (1.00: it never drafted)."""
    fresh_gate(eng)
    out = []
    for accept in levels:
        runs = [forced_run(eng, reference, accept, new)[0] for _ in range(requests)]
        per_token = sum(sum(r.times) for r in runs) / sum(sum(r.times) / r.total_per_token
                                                          for r in runs)
        per_req = [round(r.per_step, 2) for r in runs]
        out.append(dict(accept=accept, ms_per_token=per_token * 1e3,
                        speedup=plain_step / per_token, tokens_per_step=per_req,
                        pooled=eng.proposer.policy.pooled()))
        print(f"  {accept} accepted, {requests} requests: {per_token * 1e3:.3f} ms/token, "
              f"{plain_step / per_token:.2f}x plain; tokens/step per request {per_req}; "
              f"pooled {out[-1]['pooled']:.3f}", flush=True)
    return out


class _Every:
    """A load gate that lets every ``n``-th step draft (the others stay plain and overlap);
    ``n`` None: none."""

    def __init__(self, n: int | None):
        self.n, self.calls = n, 0

    def allows_next(self) -> bool:
        """What the next :meth:`allow` will answer."""
        return self.n is not None and (self.calls + 1) % self.n == 0

    def allow(self, num_seqs: int) -> bool:
        allowed = self.allows_next()
        self.calls += 1
        return allowed

    def record(self, *args, **kwargs) -> None:
        pass


def profile_text(prof, limit: int, by_own_time: bool = False) -> str:
    """The ``limit`` costliest calls (cumulative) of the cProfile ``prof``, then with
    ``by_own_time`` the ``limit`` costliest by their own time."""
    text = io.StringIO()
    st = pstats.Stats(prof, stream=text)
    st.sort_stats("cumulative").print_stats(limit)
    if by_own_time:
        st.sort_stats("tottime").print_stats(limit)
    return text.getvalue()


def profile_first(eng: LLMEngine, reference: list[int], new: int, path: str) -> None:
    """The engine's first request after warm-up, every draft rejected, under cProfile: where a
    first-use stall (45-73 ms in one early decode step, sessions 12-16) spends host time.
    Writes the step times and the 40 costliest calls, cumulative and by own time, to ``path``."""
    import cProfile

    fresh_gate(eng)
    force_acceptance(eng, reference, 0)
    prof = cProfile.Profile()
    r = prof.runcall(run, eng, new)
    with open(path, "w") as f:
        f.write(f"all steps ms: {[round(t * 1e3, 2) for t in r.times]}\n\n")
        f.write(profile_text(prof, 40, by_own_time=True))
    print(f"  first request: slowest steps "
          f"{[round(t * 1e3, 2) for t in sorted(r.times, reverse=True)[:4]]} ms; {path}",
          flush=True)


def profile_drafting(eng: LLMEngine, new: int, path: str, every: int = 8) -> None:
    """One request where every ``every``-th step drafts (the MTP catches up on the steps before
    it), under cProfile and then torch.profiler: where a drafting step's time goes. Writes the
    30 costliest calls (cumulative) and the 30 costliest ops by device time to ``path``."""
    import cProfile

    from torch.profiler import ProfilerActivity, profile

    policy = eng.proposer.policy
    gate, policy.gate = policy.gate, _Every(every)
    prior, policy.prior = policy.prior, 0.99
    try:
        prof = cProfile.Profile()
        r = prof.runcall(run, eng, new)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
            run(eng, new)
    finally:
        policy.gate, policy.prior = gate, prior
    slow = sorted(r.times, reverse=True)[:6]
    with open(path, "w") as f:
        f.write(f"steps ms (slowest 6): {[round(t * 1e3, 2) for t in slow]}\n")
        f.write(f"all steps ms: {[round(t * 1e3, 2) for t in r.times]}\n\n")
        f.write(profile_text(prof, 30))
        f.write(tp.key_averages().table(sort_by="cuda_time_total", row_limit=30))
        f.write(tp.key_averages().table(sort_by="cpu_time_total", row_limit=30))
    print(f"  drafting every {every} steps: slowest steps {[round(t * 1e3, 2) for t in slow]} ms;"
          f" profile in {path}", flush=True)


def divergence(plain: list[int], tokens: list[int], margins: list[float]) -> dict:
    """Where ``tokens`` first leaves plain decoding's ``plain``, with plain decoding's top-1 minus
    top-2 logprob there (nats): a near tie, or a bug when the margin is large."""
    at = next((i for i, (x, y) in enumerate(zip(plain, tokens)) if x != y), None)
    if at is None:
        return dict(diverged_at=None, note="output equals plain decoding")
    return dict(diverged_at=at, margin=margins[at],
                note=f"output leaves plain decoding at token {at} (plain's top-2 margin there "
                     f"{margins[at]:.4f} nats)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-next-3b")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--adaptive", action="store_true",
                    help="the adaptive draft-length policy on (the server's default): where "
                         "drafts do not pay it drafts fewer or none")
    ap.add_argument("--carry-over", nargs="+", type=int, metavar="A",
                    help="with --adaptive: instead of the rows, these acceptance levels in this "
                         "order (e.g. 1 3), the gate and pooled acceptance carried from each "
                         "level to the next, --requests requests per level: whether drafting "
                         "comes back after a spell of poor drafts")
    ap.add_argument("--requests", type=int, default=8, help="with --carry-over")
    ap.add_argument("--profile-first", metavar="PATH",
                    help="with --adaptive: before the rows, the MTP engine's first request "
                         "(every draft rejected) under cProfile: its step times and where the "
                         "host time of its slowest step goes, written to PATH")
    ap.add_argument("--json")
    ap.add_argument("--log-compiles", help="append each Triton compile to this file")
    ap.add_argument("--profile", help="with --adaptive: profile a request that drafts every 8th "
                                      "step, write the tables here")
    a = ap.parse_args()
    if a.log_compiles:
        from triton_compile_log import log_compiles

        log_compiles(a.log_compiles)
    plain = build(a.shape, a.device, None)
    plain.warmup()
    reference, plain_step = run(plain, a.new)[:2]
    margins = run(plain, a.new, logprobs=2).margins
    del plain
    print(f"{a.shape}: plain decode {plain_step * 1e3:.3f} ms/token")
    spec = SpeculativeConfig(algorithm="nextn", num_steps=a.k, adaptive=a.adaptive)
    eng = build(a.shape, a.device, spec)
    eng.warmup()
    if a.carry_over:
        rows = {"plain_ms_per_token": plain_step * 1e3,
                "carry_over": carry_over(eng, reference, a.carry_over, a.requests, a.new,
                                         plain_step)}
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
    if a.profile_first:
        profile_first(eng, reference, a.new, a.profile_first)
    rows = {"plain_ms_per_token": plain_step * 1e3, "adaptive": a.adaptive, "accepted": {}}
    for accept in range(a.k + 1):
        fresh_gate(eng)
        r, _ = forced_run(eng, reference, accept, a.new)
        tokens, step, per_step = r.tokens, r.step, r.per_step
        per_token = r.total_per_token if a.adaptive else step / per_step
        row = dict(step_ms=step * 1e3, tokens_per_step=per_step, ms_per_token=per_token * 1e3,
                   speedup=plain_step / per_token, **divergence(reference, tokens, margins))
        if a.adaptive:
            row["policy"] = policy_state(eng, r)
        rows["accepted"][accept] = row
        print(f"  {accept} of {a.k} accepted: {step * 1e3:.3f} ms/step, {per_step:.2f} "
              f"tokens/step, {per_token * 1e3:.3f} ms/token, {plain_step / per_token:.2f}x "
              f"plain; {row['note']}", flush=True)
        if a.adaptive:
            print(f"    policy: {row['policy']}", flush=True)
    if a.adaptive:
        rows["gate_vetoes"] = vetoed(eng, reference, margins, a.new, plain_step)
        if a.profile:
            profile_drafting(eng, a.new, a.profile)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
