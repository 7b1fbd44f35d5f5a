"""Draft-model proposer: a smaller model with the same tokenizer drafts k tokens autoregressively.

The draft model has its own paged KV cache and block table per request. Each step it first
catches up on the tokens the target accepted since its last proposal (one varlen forward pass for
the whole batch), then runs k - 1 more single-token steps. Its KV is rolled back by keeping only
the longest common prefix of what it computed and what the target accepted: rejected drafts'
slots are simply overwritten later, as in the target's cache.

A hybrid draft model (recurrent state) cannot roll back to any prefix, so each request keeps a
second state slot: a snapshot taken right after the catch-up pass (the state after the last token
the target had accepted). The next proposal restores the snapshot and recomputes the few tokens
accepted since.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtpserve.config import EngineConfig, ModelConfig
from mtpserve.engine.block_manager import BlockManager
from mtpserve.engine.model_runner import ModelRunner
from mtpserve.engine.sampler import Sampler, SamplingRow, make_generator
from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from mtpserve.engine.sequence import Sequence
from mtpserve.sampling_params import SamplingParams
from mtpserve.spec.proposer import Proposer

# Seeded requests draw their drafts from a generator seeded with seed + this, so the draft's
# randomness never shares a stream with the target's verification draws.
DRAFT_SEED_OFFSET = 0x5EED


@dataclass
class _DraftState:
    shadow: Sequence                     # the draft model's view: token ids, blocks, progress
    generator: torch.Generator | None
    snapshot: int | None = None          # hybrid draft models: state slot after snap_len tokens
    snap_len: int = 0


class DraftModelProposer(Proposer):
    """Drafts with ``runner.model`` over its own KV pool.

    Args:
        num_steps: k. runner: a ``ModelRunner`` holding the draft model and its KV cache.
        eos_token_ids: the target's EOS ids (for the min_tokens ban while drafting).
        greedy_only: always draft the argmax (a deterministic proposer), whatever the request's
            temperature; otherwise sampled requests draft from q and report it.

    Raises:
        ValueError: the draft model's vocabulary differs from the target's.
    """

    # each proposal first catches up on every token accepted since the last one (_state: the
    # longest common prefix of its view and the target's tokens), however many steps ago
    skips_steps = True

    def __init__(self, num_steps: int, runner: ModelRunner, target_vocab: int,
                 eos_token_ids: tuple[int, ...], greedy_only: bool = False, policy=None):
        super().__init__(num_steps, policy)
        if runner.model_config.vocab_size != target_vocab:
            raise ValueError(f"the draft model's vocabulary ({runner.model_config.vocab_size}) "
                             f"differs from the target's ({target_vocab}); use a draft model "
                             f"with the same tokenizer")
        self.runner = runner
        self.bm = BlockManager(runner.num_blocks, runner.block_size, enable_prefix_caching=False)
        self.sampler = Sampler(runner.model_config.vocab_size, seed=DRAFT_SEED_OFFSET)
        self.eos = eos_token_ids
        self.greedy_only = greedy_only
        self.states: dict[str, _DraftState] = {}

    # ---- state -------------------------------------------------------------------------------
    def _state(self, seq: Sequence) -> _DraftState:
        st = self.states.get(seq.request_id)
        if st is None:
            shadow = Sequence(seq.request_id, seq.token_ids, SamplingParams(), (),
                              seq.max_model_len, None, None)
            seed = seq.params.seed
            gen = make_generator(None if seed is None else seed + DRAFT_SEED_OFFSET,
                                 self.runner.device)
            st = self.states[seq.request_id] = _DraftState(shadow, gen)
            if self.runner.state_cache is not None and not self._take_slots(st):
                return None
        if st.snapshot is not None:
            self.runner.state_cache.copy_slot(st.snapshot, st.shadow.state_slot)
            st.shadow.num_computed_tokens = st.snap_len
        shadow, n = st.shadow, 0
        limit = min(len(shadow.token_ids), len(seq.token_ids))
        while n < limit and shadow.token_ids[n] == seq.token_ids[n]:
            n += 1
        # the newest token never counts as computed: each proposal starts from its logits
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, n, len(seq.token_ids) - 1)
        shadow.token_ids = list(seq.token_ids)
        return st

    def _take_slots(self, st: _DraftState) -> bool:
        cache = self.runner.state_cache
        if cache.num_free < 2:
            del self.states[st.shadow.request_id]
            return False
        st.shadow.state_slot, st.snapshot = cache.alloc(), cache.alloc()
        return True

    def release(self, seq: Sequence) -> None:
        super().release(seq)
        st = self.states.pop(seq.request_id, None)
        if st is not None:
            self.bm.free_seq(st.shadow)
            for slot in (st.shadow.state_slot, st.snapshot):
                if slot is not None:
                    self.runner.state_cache.free(slot)

    # ---- drafting ------------------------------------------------------------------------------
    def capture_cuda_graphs(self) -> None:
        """Capture the draft model's forwards like the target's, once at start: attention-only
        draft models (a hybrid draft runs eagerly: its snapshot slots are outside what
        hybrid_graph.py lays out); nothing off CUDA."""
        if self.runner.state_cache is None:
            self.runner.capture_cuda_graphs()

    def draft(self, work: list[tuple[Sequence, int]]) -> None:
        active = [(seq, st, budget) for seq, budget in work
                  if (st := self._state(seq)) is not None]
        qs: dict[str, list[torch.Tensor]] = {seq.request_id: [] for seq, _ in work}
        while active:
            active = self._draft_one(active, qs)
        for seq, _ in work:
            q = qs[seq.request_id]
            if q and not self._greedy(seq):
                seq.draft_probs = torch.stack(q)

    def _greedy(self, seq: Sequence) -> bool:
        return self.greedy_only or seq.params.greedy

    def _draft_one(self, active, qs):
        """One forward pass of the draft model: one more draft token for every active sequence."""
        sched, kept = SchedulerOutput(), []
        for seq, st, budget in active:
            sh = st.shadow
            if self.bm.allocate(sh, sh.num_tokens):
                sched.scheduled.append(ScheduledSeq(sh, sh.num_tokens - sh.num_computed_tokens, []))
                kept.append((seq, st, budget))
        if not kept:
            return []
        batch, _ = self.runner.prepare(sched)
        _, logits = self.runner.execute(batch)
        rows = [SamplingRow(SamplingParams(temperature=0.0) if self._greedy(seq) else seq.params,
                            st.generator, seq.prompt_token_ids,
                            seq.output_token_ids + seq.draft_token_ids, self.eos)
                for seq, st, _ in kept]
        q = self.sampler.probs(self.sampler.process_logits(logits, rows), rows)
        tokens = self.sampler.draw(q, rows).tolist()
        still = []
        for i, (seq, st, budget) in enumerate(kept):
            st.shadow.num_computed_tokens = st.shadow.num_tokens
            if st.snapshot is not None and not seq.draft_token_ids:  # right after the catch-up
                self.runner.state_cache.copy_slot(st.shadow.state_slot, st.snapshot)
                st.snap_len = st.shadow.num_computed_tokens
            st.shadow.token_ids.append(tokens[i])
            seq.draft_token_ids = seq.draft_token_ids + [tokens[i]]
            qs[seq.request_id].append(q[i])
            if len(seq.draft_token_ids) < budget:
                still.append((seq, st, budget))
        return still


def build_draft_runner(config: EngineConfig, draft_path: str, target_runner: ModelRunner,
                       max_model_len: int) -> ModelRunner:
    """A runner for the draft model: the target's own weights when ``draft_path`` is the target
    (self-drafting shares them; only the KV cache is new), else the model at ``draft_path``."""
    from mtpserve.loader import load_model_files

    slots = 2 * config.max_num_seqs  # hybrid draft models: working state + snapshot
    blocks = target_runner.num_blocks  # a block for every block the target can hand out
    if draft_path in ("self", "target"):
        return ModelRunner(config, target_runner.model_config, None, max_model_len,
                           model=target_runner.model, state_slots=slots, num_blocks=blocks)
    files = load_model_files(draft_path)
    return ModelRunner(config, ModelConfig.from_hf(files.hf_config), files, max_model_len,
                       state_slots=slots, num_blocks=blocks)
