"""What the draft-head tests share (tests/test_draft_head.py, test_draft_head_engine.py,
test_fp8_draft_head.py, fp8_head_check.py): a small random LM head and its target, the FR-Spec
subset, the tiny MTP checkpoint with its token map, the prompts and engine settings of the
engine tests, and the engine on the trained tiny checkpoint."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hybrid_checkpoint import random_mtp_checkpoint
from mtpserve import LLM, SamplingParams
from mtpserve.kernels import cpu_linear
from mtpserve.layers.embedding import ParallelLMHead
from trained_hybrid import trained_hybrid_dir

V, H = 200, 32
SUBSET = [150, 3, 77, 31, 199, 0, 64, 12, 101, 5, 188, 40]   # unsorted on purpose

K = 3
GREEDY = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
KW = dict(dtype="float32", max_model_len=128, num_kv_blocks=128, block_size=4, max_num_seqs=8)
HOT = torch.randperm(256, generator=torch.Generator().manual_seed(1))[:100]   # of 256, unsorted


def lm_head(packed: bool = False, seed: int = 0) -> ParallelLMHead:
    """A [V, H] float32 LM head of random weights (``packed``: with its MKL-packed copy)."""
    head = ParallelLMHead(V, H)
    head.weight.data.copy_(torch.randn(V, H, generator=torch.Generator().manual_seed(seed)))
    if packed:
        head.packed = cpu_linear.pack(head.weight)
    return head


def target_of(lm: ParallelLMHead) -> SimpleNamespace:
    """A target model as the draft heads see it: its ``lm_head`` and ``compute_logits``."""
    return SimpleNamespace(lm_head=lm, compute_logits=lm)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """(random tiny MTP checkpoint, the .pt token map HOT next to it)."""
    d = tmp_path_factory.mktemp("draft_head")
    torch.save(HOT, d / "hot.pt")
    return random_mtp_checkpoint(d / "tiny")[0], str(d / "hot.pt")


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(2, 256, (n,), generator=g).tolist() for n in (4, 13, 7, 19, 9)]


def token_ids(llm: LLM, ps, params=GREEDY) -> list[list[int]]:
    return [r.outputs[0].token_ids for r in llm.generate(ps, params)]


TRAINED_GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def trained_llm(**speculative) -> LLM:
    """An MTP engine on the trained tiny checkpoint (CPU, float32), k = K, adaptive policy off
    (every step drafts min(k, room)); ``speculative``: further ``speculative_*`` settings."""
    return LLM(str(trained_hybrid_dir()), dtype="float32", device="cpu", max_model_len=64,
               num_kv_blocks=64, speculative_algorithm="nextn", speculative_num_steps=K,
               speculative_adaptive=False, **speculative)
