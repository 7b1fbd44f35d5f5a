"""The engine: add requests, call ``step()`` until they finish (steps overlap under async
scheduling, engine/overlap.py)."""

from __future__ import annotations

import copy
import logging
import time

import torch

from mtpserve.config import EngineConfig, ModelConfig
from mtpserve.engine.block_manager import BlockManager
from mtpserve.engine.deferred_cost import DeferredCost
from mtpserve.engine.detokenizer import IncrementalDetokenizer
from mtpserve.engine.model_runner import ModelRunner
from mtpserve.engine.overlap import (PendingStep, next_token_ids, overlappable,
                                     patch_input_ids)
from mtpserve.engine.sampler import Sampler, SamplerOutput, SamplingRow
from mtpserve.engine.scheduler import ScheduledSeq, Scheduler
from mtpserve.engine.sequence import Sequence
from mtpserve.engine.stats_logger import StatsLogger
from mtpserve.engine.step_timer import StepTimer
from mtpserve.engine.validation import validate_request
from mtpserve.kernels import compile_ahead
from mtpserve.outputs import RequestOutput
from mtpserve.sampling_params import SamplingParams
from mtpserve.spec import build_proposer, draft_head_bytes
from mtpserve.spec.metrics import SpecMetrics
from mtpserve.spec.verify import VerifyInput, verify

logger = logging.getLogger(__name__)


class LLMEngine:
    """Continuous-batching engine over one model.

    Args:
        config: engine settings.
        files: already-loaded ``ModelFiles`` (default: ``load_model_files(config.model)``).

    Raises:
        ValueError: the KV cache cannot hold one ``max_model_len`` sequence, or the model is
            unsupported.
    """

    def __init__(self, config: EngineConfig, files=None):
        from mtpserve.loader import load_model_files

        t0 = time.perf_counter()
        compile_ahead.warm_up_in_background(config.torch_device())
        files = files or load_model_files(config.model, config.tokenizer)
        self.config = config
        self.tokenizer = files.tokenizer
        self.model_config = ModelConfig.from_hf(files.hf_config)
        mc = self.model_config
        self.max_model_len = config.max_model_len or mc.max_position_embeddings
        # FR-Spec's token ids, read once, before the weights load (a bad map fails at once)
        self.token_map = _read_token_map(config.speculative, mc.vocab_size)
        eos = set(mc.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = tuple(sorted(eos))
        self.runner = ModelRunner(config, mc, files, self.max_model_len, reserve_bytes=(
            draft_head_bytes(self.token_map, mc.hidden_size, config.torch_dtype(), mc.vocab_size,
                             config.speculative and config.speculative.draft_head_quantization)))
        self._check_kv_capacity()
        state = self.runner.state_cache
        prefix_caching = config.enable_prefix_caching and state is None
        if config.enable_prefix_caching and state is not None:
            logger.info("prefix caching is off: recurrent state is only known at the end of a "
                        "sequence, so a cached prefix would be recomputed anyway")
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size,
                                          prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs,
                                   config.max_num_batched_tokens, state)
        self.sampler = Sampler(mc.vocab_size, seed=config.seed)
        self.seqs: dict[str, Sequence] = {}
        self.num_aborted = 0   # live requests aborted (client gone, shutdown)
        self.device = self.runner.device
        self.spec_metrics = SpecMetrics(config.speculative.num_steps if config.speculative else 0)
        self.step_timer = StepTimer()   # before the proposer: its policy reads it
        self.proposer = build_proposer(config.speculative, self)
        self.spec_metrics.pool = getattr(getattr(self.proposer, "policy", None), "shared", None)
        self.stats_logger = StatsLogger()
        self.async_scheduling = (self.device.type == "cuda" if config.async_scheduling is None
                                 else config.async_scheduling)
        self._pending: PendingStep | None = None   # async scheduling: the step still running
        # async scheduling: sequences whose deltas of the last synchronous step are still to be
        # taken (``take_deferred_outputs``, while the device runs the next step)
        self._unsent: list[Sequence] = []
        # what taking them costs the host, learned as they are taken
        self.deferred_cost = DeferredCost()
        # perf_counter seconds when the last step's tokens were appended (None: idle since)
        self._done_at: float | None = None
        self._drafted = False   # whether the last step verified drafts (the step timer's switch)
        if not config.enforce_eager:
            self.runner.capture_cuda_graphs()
            if hasattr(self.proposer, "capture_cuda_graphs"):
                self.proposer.capture_cuda_graphs()
        logger.info("engine built in %.1f s (%s, %s, max_model_len %d)", time.perf_counter() - t0,
                    mc.model_type, self.runner.dtype, self.max_model_len)

    def _check_kv_capacity(self) -> None:
        capacity = self.runner.num_blocks * self.config.block_size
        if capacity < self.max_model_len:
            raise ValueError(f"the KV cache holds {capacity} tokens, less than max_model_len "
                             f"({self.max_model_len}); lower --max-model-len or give the cache "
                             f"more memory")

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams) -> None:
        """Queue a request (``params.n`` must be 1: fan-out happens above the engine).

        Raises:
            SamplingParamsError: the request cannot be served (see ``validate_request``).
            ValueError: duplicate request id.
        """
        if request_id in self.seqs:
            raise ValueError(f"duplicate request id {request_id!r}")
        validate_request(prompt_token_ids, params, self.model_config.vocab_size, self.max_model_len)
        detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                                       params.stop, params.include_stop_str_in_output)
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
        seq = Sequence(request_id, prompt_token_ids, params, self.eos_token_ids,
                       self.max_model_len, detok, gen)
        self.seqs[request_id] = seq
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        """Drop a request and free its blocks (no-op for an unknown or finished id)."""
        seq = self.seqs.get(request_id)
        if seq is not None:
            self._drop(seq)
            seq.finish("abort")
            self.num_aborted += 1
            if not self.has_unfinished_requests():
                self._idle()

    def has_unfinished_requests(self) -> bool:
        return (self.scheduler.has_unfinished() or self._pending is not None
                or bool(self._unsent))

    # ---- the step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one forward pass over the scheduled batch; return each touched request's delta.

        Under speculation the proposer first drafts tokens for every decoding sequence; the
        target then verifies all drafts in the same pass that decodes the others. Under async
        scheduling (engine/overlap.py) the deltas returned are those of the previous step.
        """
        t0 = time.perf_counter()
        if self._done_at is None:   # busy again after idling: this step's time starts now
            self._done_at = t0
        allowed = arm = None  # the draft-length policy's say on this step, asked once
        decoding = [s for s in self.scheduler.running if not s.in_prefill]
        if self.proposer is not None:   # (a step of prefills alone could not draft: it would
            # spend a due probe of the load gate for nothing, and with request lengths that are
            # a multiple of the probe interval every probe after it too)
            allowed = self.proposer.allow_drafts(len(decoding)) if decoding else False
            arm = self._gate_arm(bool(decoding))
        if self._can_overlap(decoding, allowed):
            outputs = self._overlapped_step(decoding, allowed, arm)
        else:   # drain: this step needs every token on the host
            outputs = self._resolve() if self._pending is not None else []
            outputs += self._sync_step(allowed, arm)
        if not (self.scheduler.has_unfinished() or self._pending is not None):
            outputs += self.take_deferred_outputs()   # no next step to take them behind
            self._idle()
        return outputs

    def _gate_arm(self, decodes: bool):
        """The load gate's decision on this step (spec/policy.py ``GateArm``), for a step with
        ``decodes`` sequences past prefill; None without a gate or for a step of prefills
        alone (which also ends the gate's run of drafting steps: the next is a switch)."""
        if not decodes:
            self._policy_call("reset_switch")
            return None
        return self._policy_call("step_arm")

    def _idle(self) -> None:
        """Nothing left to run: the time until the next request is no step's, and the next
        step that drafts starts from scratch (a switch)."""
        self._done_at = None
        self._policy_call("reset_switch")

    def _policy_call(self, name: str):
        """The draft-length policy's method ``name`` called, if there is a policy with one (a
        policy of one's own may lack it); its result, else None."""
        method = getattr(getattr(self.proposer, "policy", None), name, None)
        return method() if method is not None else None

    def _sync_step(self, allowed: bool | None, arm=None) -> list[RequestOutput]:
        """One step run to its end on the host (drafts proposed, verified, appended); ``arm``:
        the load gate's decision on it (spec/policy.py ``GateArm``)."""
        t0 = time.perf_counter()
        if self.proposer is not None:
            self.proposer.propose([s for s in self.scheduler.running if not s.in_prefill],
                                  allowed)
        sched = self.scheduler.schedule()
        if not sched.scheduled:
            return self.take_deferred_outputs()
        batch, layout = self.runner.prepare(sched)
        if self.proposer is not None:   # drafts still on the device go in on the device
            self.proposer.patch_inputs(batch, sched)
        hidden, logits = self.runner.execute(batch)
        sampling = [(s, layout.rows[i][0]) for i, s in enumerate(sched.scheduled) if s.samples]
        ahead = items = None
        if self.proposer is not None:   # their host copies, now that the forward is queued
            self.proposer.resolve_drafts(sched)
            if any(s.draft_token_ids for s, _ in sampling):
                items = self._verify_items(sampling)
            ahead = self.proposer.verify_ahead(sched, batch, layout, hidden, logits,
                                               self.sampler, items)
        taken_at = time.perf_counter()
        outputs = self.take_deferred_outputs()   # the last step's, while the device runs this
        t0 += time.perf_counter() - taken_at     # (their time is the last step's)
        starts = [s.seq.num_computed_tokens for s in sched.scheduled]
        for s in sched.scheduled:
            s.seq.num_computed_tokens += s.num_new_tokens
        if items is not None:
            emitted = self._verify(sampling, logits, items, ahead)
        else:   # (a step of prefill chunks only samples nothing)
            emitted = self._sample(sampling, logits) if sampling else 0
        if self.proposer is not None:
            self.proposer.observe(self._kept_hidden(sched, starts, batch, hidden))
        for s in sched.scheduled:
            self._settle(s)
            if not s.samples:
                continue
            if self.async_scheduling and not (s.seq.is_finished or s.seq.first_delta_due):
                self._unsent.append(s.seq)   # mid-stream: taken behind the next launch
            else:   # (a request's first and last deltas come at once: TTFT, completion)
                outputs.append(s.seq.take_output())
        self.stats_logger.step(self, emitted)
        after_plain = not self._drafted
        # the deltas left for the next call are this step's work: their expected seconds
        # count as its own, and the next step's time starts after them (take_deferred_outputs)
        now = time.perf_counter()
        deferred = self.deferred_cost.expect(len(self._unsent))
        self._record_for_policy(sched, emitted, now + deferred - self._done_at, arm,
                                synchronous=True)
        self._done_at = now + deferred
        graphs = self.runner.graphs
        if graphs is not None and graphs.can_run(batch):
            self.step_timer.record(batch.num_tokens, batch.num_seqs,
                                   time.perf_counter() - t0 + deferred,
                                   graphs.step_cost(batch.num_tokens), after_plain,
                                   sum(1 for s in sched.scheduled if s.draft_token_ids))
        self._drafted = items is not None
        return outputs

    # ---- async scheduling (engine/overlap.py) ---------------------------------------------------
    def _can_overlap(self, decoding: list[Sequence], allowed: bool | None) -> bool:
        """Async scheduling applies: no request reads its output so far when sampling, and no
        drafts this step (no proposer, or one that may skip steps or follow a launched step
        and drafts nothing for ``decoding``: the gate's ``allowed`` is False or the policy
        gives every sequence 0)."""
        p = self.proposer
        return (self.async_scheduling
                and all(overlappable(s.params) for s in self.seqs.values())
                and (p is None or ((p.skips_steps or p.observes_launched)
                                   and p.drafts_nothing(decoding, allowed))))

    def _overlapped_step(self, decoding: list[Sequence], allowed: bool | None,
                         arm=None) -> list[RequestOutput]:
        """Launch a step (its input ids for pending tokens taken on the device), then read back
        and post-process the previous step while this one runs; return that step's deltas.
        ``decoding``, ``allowed``: the sequences past prefill and the gate's say, for the proposer's
        propose (which drafts nothing here: ``_can_overlap``; the policy still counts the step);
        ``arm``: the load gate's decision on it, recorded when it is read back."""
        self._drafted = False
        for seq in self.scheduler.running:   # drafts a budget-limited step left unscheduled
            seq.draft_token_ids, seq.draft_probs = [], None
        if self.proposer is not None:
            self.proposer.propose(decoding, allowed)
        sched = self.scheduler.schedule()
        if self.proposer is not None:   # as the synchronous engine's drop after their last step
            for seq in sched.retired:
                self.proposer.release(seq)
        if not sched.scheduled:
            outputs = self.take_deferred_outputs()
            return outputs + (self._resolve() if self._pending is not None else [])
        batch, layout = self.runner.prepare(sched)
        if self._pending is not None:
            patch_input_ids(batch, sched, self._pending)
        hidden, logits = self.runner.execute(batch)
        sampling = [(s, layout.rows[i][0]) for i, s in enumerate(sched.scheduled) if s.samples]
        for s in sched.scheduled:
            s.seq.num_computed_tokens += s.num_new_tokens
        result = self._sample_on_device(sampling, logits)
        observe = self.proposer is not None and self.proposer.observes_launched
        if observe:   # the ids after each token, while the previous step's are still pending
            next_ids = next_token_ids(batch, sched, result.token_ids, self._pending)
        launched = PendingStep.launch(sched, sampling, result, arm)
        if observe:   # queued behind the copy of the sampled ids: reading them back won't wait
            self.proposer.observe_launched(sched, hidden, next_ids)
        for s in sched.scheduled:   # publish full blocks now: the next step may admit a match
            self.block_manager.register_full_blocks(s.seq)
        outputs = self.take_deferred_outputs()
        if self._pending is not None:
            outputs += self._resolve()
        self._pending = launched
        return outputs

    def _resolve(self) -> list[RequestOutput]:
        """Read back the pending step's tokens, append them (stop checks included); return its
        deltas. A sequence that finished, or was aborted, while the step ran drops its token."""
        step, self._pending = self._pending, None
        token_ids = step.token_ids()
        done = {id(s.seq) for s in step.sched.scheduled if s.seq.is_finished}
        for i, (s, _) in enumerate(step.sampling):
            if id(s.seq) not in done:
                lp = step.logprobs[i] if step.logprobs is not None else None
                s.seq.append_token(token_ids[i], lp)
        outputs = []
        for s in step.sched.scheduled:
            if id(s.seq) not in done:
                outputs.extend(self._postprocess(s))
        emitted = sum(len(o.new_token_ids) for o in outputs)
        self.stats_logger.step(self, emitted)
        # in a pipeline a step takes from the previous step's read-back to its own (also when a
        # drafting step drains it)
        now = time.perf_counter()
        self._record_for_policy(step.sched, emitted, now - self._done_at, step.arm,
                                synchronous=False)
        self._done_at = now
        return outputs

    def _record_for_policy(self, sched, emitted: int, seconds: float, arm,
                           synchronous: bool) -> None:
        """Decode steps (every sequence computes its newest token, with or without drafts) tell
        the draft-length policy's gate what its decision ``arm`` on them yielded: ``emitted``
        tokens in ``seconds``, the engine's wall time from the previous step's end to this
        one's (the host's work between steps included, so that the steps of both arms add up to
        the time the requests waited; timed from the step's own start, a synchronous drafting
        step left out the engine loop's work between steps, which plain steps in a pipeline
        carried); ``synchronous``: it ran without async scheduling."""
        policy = getattr(self.proposer, "policy", None)
        if policy is None or any(s.num_new_tokens != 1 for s in sched.scheduled):
            return
        policy.record_step(len(sched.scheduled), arm, emitted, seconds, synchronous)

    @staticmethod
    def _kept_hidden(sched, starts, batch, hidden):
        """Per running sequence: (first position, hidden states [n, H]) of the positions this
        step computed and kept (prefill tokens; a verify's last token and accepted drafts)."""
        items, offset = [], 0
        for s, start, q in zip(sched.scheduled, starts, batch.query_lens_cpu):
            n = s.seq.num_computed_tokens - start
            if n > 0 and not s.seq.is_finished:
                items.append((s.seq, start, hidden[offset:offset + n]))
            offset += q
        return items

    def _sample_on_device(self, sampling, logits) -> SamplerOutput:
        """One token per sampling row, left on the device (logprobs, when asked, on the host)."""
        if not sampling:
            return SamplerOutput(logits.new_empty(0, dtype=torch.int64))
        return self.sampler.sample(logits, [self._row(s.seq) for s, _ in sampling])

    def _sample(self, sampling, logits) -> int:
        """Sample and append one token per row of ``sampling``; return how many (its length)."""
        result = self._sample_on_device(sampling, logits)
        token_ids = result.token_ids.tolist()
        for i, (s, _) in enumerate(sampling):
            lp = result.logprobs[i] if result.logprobs is not None else None
            s.seq.append_token(token_ids[i], lp)
        return len(sampling)

    def _verify_items(self, sampling) -> list[VerifyInput]:
        """One VerifyInput per sampling row of ``sampling`` (its 1 + drafts rows, first logits
        row, drafts and q), in order: what ``verify`` and the proposer's ``verify_ahead`` both
        decide from."""
        items = []
        for s, first in sampling:
            seq, drafts = s.seq, s.draft_token_ids
            rows = [self._row(seq, drafts[:i]) for i in range(len(drafts) + 1)]
            q = seq.draft_probs[: len(drafts)] if seq.draft_probs is not None else None
            items.append(VerifyInput(rows, first, drafts, q))
        return items

    def _verify(self, sampling, logits, items: list[VerifyInput], ahead=None) -> int:
        """Verify the drafts of ``sampling``'s sequences (``items``: their ``_verify_items``)
        against ``logits`` and append the tokens each emits (up to a stop); return how many
        tokens were appended in all. ``ahead``: the proposer's AheadStep
        (spec/draft_ahead.py), whose targets (each row's token if kept, decided on the device)
        are used as read."""
        state, row, appended = self.runner.state_cache, 0, 0
        targets = ahead.targets() if ahead is not None else None
        for (s, _), res in zip(sampling, verify(self.sampler, logits, items, targets)):
            seq = s.seq
            seq.num_computed_tokens += res.num_accepted  # their K/V, written by this pass, stays
            if state is not None and s.draft_token_ids:
                # roll the state back, unless the device did (spec/draft_ahead.py commit_ahead)
                if res.num_accepted < len(s.draft_token_ids) and not (
                        ahead is not None and ahead.committed_as(seq.request_id,
                                                                 res.num_accepted)):
                    state.commit(seq.state_slot, row, res.num_accepted)
                row += 1
            if s.draft_token_ids:
                self.spec_metrics.record(len(s.draft_token_ids), res.num_accepted)
                self.proposer.record(seq, len(s.draft_token_ids), res.num_accepted)
                seq.spec.num_draft_tokens += len(s.draft_token_ids)
                seq.spec.num_accepted_tokens += res.num_accepted
                seq.spec.num_verify_steps += 1
            for t, lp in zip(res.token_ids, res.logprobs):
                appended += 1
                if seq.append_token(t, lp):
                    break
        return appended

    def _row(self, seq: Sequence, drafts: list[int] = ()) -> SamplingRow:
        p = seq.params
        history = drafts and (p.needs_penalties or p.min_tokens > 0)  # else the row never reads it
        out = seq.output_token_ids + list(drafts) if history else seq.output_token_ids
        return SamplingRow(seq.params, seq.generator, seq.prompt_token_ids, out, self.eos_token_ids)

    def _postprocess(self, s: ScheduledSeq) -> list[RequestOutput]:
        """``_settle`` the sequence, then its delta if the step sampled it."""
        self._settle(s)
        return [s.seq.take_output()] if s.samples else []

    def _settle(self, s: ScheduledSeq) -> None:
        """After a step's tokens are appended: the drafts dropped, full blocks published for
        prefix caching, and a finished sequence taken out (blocks, slot, proposer state)."""
        seq = s.seq
        seq.draft_token_ids, seq.draft_probs = [], None
        self.block_manager.register_full_blocks(seq)
        if seq.is_finished:
            self._drop(seq)

    def take_deferred_outputs(self) -> list[RequestOutput]:
        """The mid-stream deltas a synchronous step left under async scheduling (``_unsent``:
        not a request's first or last), taken now. The next call takes them behind its launch:
        detokenizing and building the outputs (~0.6 ms a step at 64 requests on the CPU,
        BENCHMARKS.md session 38) then run while the device computes the next step, instead of
        between the read-back and the next launch. A caller about to end streams (an abort, a
        shutdown) takes them first, so that tokens computed before the end are sent. A request
        aborted since has none.

        Their seconds are the step's that left them, not the one that takes them: that step
        was recorded (for the load gate and the step timer) with their expected seconds
        (``deferred_cost``, learned here), and the next step's time starts that much after its
        end, so the steps tile the engine's wall time, though never later than the end of this
        take (an expectation above what they took must not eat the next step's own time).
        Left in the step that takes them, the one plain step of a load gate's probe after a run
        of drafting steps carried 64 requests' outputs: the gate then measured plain decoding
        slower than it was and kept drafting at 64 requests where it lost (H100, session 39).
        An expectation stands in for the real figure because the gate decides the next step
        before these are taken."""
        start = time.perf_counter()
        seqs, self._unsent = self._unsent, []
        outputs = [seq.take_output() for seq in seqs if seq.finish_reason != "abort"]
        if seqs:
            end = time.perf_counter()
            self.deferred_cost.observe(len(seqs), end - start)
            if self._done_at is not None:
                self._done_at = min(self._done_at, end)
        return outputs

    def _drop(self, seq: Sequence) -> None:
        self.scheduler.remove(seq)
        self.seqs.pop(seq.request_id, None)
        if self.proposer is not None:
            self.proposer.release(seq)

    # ---- utilities ---------------------------------------------------------------------------
    def warmup(self) -> None:
        """Serve one short internal request end to end (readiness means this worked); with a
        proposer, then one greedy and one sampled request that draft k tokens at every step (the
        draft-length policy set aside), so that the verify path's first use falls before
        readiness (CUDA loads a kernel's module at its first launch: the first drafting step of
        the hybrid MTP engine took 46-73 ms on the H200, sessions 12-16, 20 ms of it in one
        ``repeat``). What they taught is forgotten: the pooled acceptance (they are neither
        evidence nor benched or scout requests on /metrics), the spec metrics, the step timer
        and the load gate are as they were."""
        pool, m = self.spec_metrics.pool, self.spec_metrics
        counts = (m.num_draft_tokens, m.num_accepted_tokens, m.num_verify_steps,
                  list(m.accepted_per_step))
        pooled = pool.snapshot() if pool is not None else None
        timer = copy.deepcopy(vars(self.step_timer))
        deferred_cost = copy.deepcopy(vars(self.deferred_cost))
        gate = getattr(getattr(self.proposer, "policy", None), "gate", None)
        gate_state = copy.deepcopy(vars(gate)) if gate is not None else None
        ids = self.tokenizer.encode("Hello") or [0]
        self._serve_internal(ids, SamplingParams(max_tokens=2, temperature=0.0))
        # two drafting steps' worth of tokens, within the context (a tiny one drafts less)
        n = min(2 + 2 * (self.proposer.k + 1), self.max_model_len - len(ids)) \
            if self.proposer is not None else 0
        if n >= 2:
            policy, self.proposer.policy = self.proposer.policy, None
            try:
                for t in (0.0, 1.0):
                    self._serve_internal(ids, SamplingParams(max_tokens=n, temperature=t, seed=0,
                                                             ignore_eos=True))
            finally:
                self.proposer.policy = policy
        if pool is not None:
            pool.restore(pooled)
        (m.num_draft_tokens, m.num_accepted_tokens, m.num_verify_steps,
         m.accepted_per_step) = counts
        vars(self.step_timer).update(timer)
        vars(self.deferred_cost).update(deferred_cost)
        if gate is not None:
            vars(gate).update(gate_state)
        self._idle()

    def _serve_internal(self, ids: list[int], params: SamplingParams) -> None:
        """One internal request of prompt ``ids`` stepped to its end."""
        rid = "__warmup__"
        self.add_request(rid, ids, params)
        while rid in self.seqs:
            self.step()

    def stats(self) -> dict:
        """Gauges and counters for /metrics and the periodic log line."""
        return {"num_running": len(self.scheduler.running),
                "num_waiting": len(self.scheduler.waiting),
                "kv_cache_usage": self.block_manager.usage(),
                "num_preemptions": self.scheduler.num_preemptions,
                "num_aborted": self.num_aborted,
                "spec": self.spec_metrics}


def _read_token_map(spec, vocab_size: int) -> torch.Tensor | None:
    """The ids of ``--speculative-token-map`` [V_sub] int64 (spec/token_map.py), or None."""
    if spec is None or spec.token_map is None:
        return None
    from mtpserve.spec.token_map import load_token_map

    return load_token_map(spec.token_map, vocab_size)
