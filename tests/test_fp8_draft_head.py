"""The FP8 draft head (``--speculative-draft-head-quantization fp8``; kernels/fp8_head_triton.py,
spec/draft_head.py ``Fp8GreedyHead``) on the CPU: the row quantization's bounds, the product's
kernel under Triton's interpreter against its PyTorch reference and compiled for sm_90, the head's
greedy ids and logits, and the whole MTP engine: greedy output equal to plain decoding with the
full head and an FR-Spec map, the FP8 copy kept out of the KV budget, acceptance on the trained
tiny model within a few drafts of the unquantized head's; the flag's errors."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from fp8_head_check import compile_for_hopper  # noqa: E402
from harness_draft_head import (HOT, KW, SUBSET, TRAINED_GREEDY, H, K, V, ckpt,  # noqa: E402,F401
                                lm_head, prompts, target_of, token_ids, trained_llm)
from harness_hybrid import one_thread_module  # noqa: E402,F401 (a fixture)
from interpreted import run_interpreted  # noqa: E402
from trained_hybrid import held_out_prompts  # noqa: E402

from mtpserve import LLM  # noqa: E402
from mtpserve.config import SpeculativeConfig  # noqa: E402
from mtpserve.kernels.dispatch import INTERPRET  # noqa: E402
from mtpserve.kernels.fp8_head_triton import (FP8, FP8_MAX, MAX_ROWS, fp8_logits,  # noqa: E402
                                              fp8_logits_torch, quantize_rows)
from mtpserve.spec.draft_head import (Fp8GreedyHead, FullVocabHead,  # noqa: E402
                                      ReducedVocabHead, build_draft_head)


# ---- the quantization and the product --------------------------------------------------------
def test_each_row_is_scaled_to_the_fp8_range_and_rounded_within_e4m3s_steps():
    """scale = the row's largest magnitude / 448, so that element maps to exactly +-448; every
    other element within half an E4M3 step (2^-4 relative for normal numbers, 2^-10 of the
    scale below them); an all-zero row gets scale 1 and zeros."""
    w = torch.randn(70, 96, generator=torch.Generator().manual_seed(0)) * 0.05
    w[3] = 0.0
    w[5, 7] = -2.0                                   # one large element dominates its row
    w8, scale = quantize_rows(w.bfloat16())
    wb = w.bfloat16().float()
    assert w8.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == (70,)
    assert torch.equal(scale[3], torch.tensor(1.0)) and not w8[3].float().any()
    live = torch.arange(70) != 3
    assert torch.allclose(scale[live], wb[live].abs().amax(1) / FP8_MAX)
    assert (w8[live].float().abs().amax(1) == FP8_MAX).all()
    err = (w8.float() * scale[:, None] - wb).abs()
    bound = torch.maximum(wb.abs() * 2 ** -4, scale[:, None] * 2 ** -10)
    assert (err <= bound * (1 + 1e-6)).all()
    assert err.max() > 0                              # rounding happened
    assert w8[5].float().abs().amax() == FP8_MAX and w8[5, 7].float() == -FP8_MAX


def test_the_reference_product_is_the_dequantized_weight_in_float32():
    g = torch.Generator().manual_seed(1)
    w8, scale = quantize_rows(torch.randn(40, 64, generator=g))
    x = torch.randn(2, 64, generator=g)
    want = x.double() @ (w8.double() * scale.double()[:, None]).t()
    assert torch.allclose(fp8_logits_torch(x, w8, scale).double(), want, rtol=1e-5, atol=1e-5)
    if not INTERPRET:   # off CUDA and the interpreter: the reference itself
        assert torch.equal(fp8_logits(x, w8, scale), fp8_logits_torch(x, w8, scale))


@pytest.mark.parametrize("bad, message", [
    (dict(w8=torch.zeros(4, 8)), "float8_e4m3fn"),
    (dict(scale=torch.ones(5)), "scale [N] float32"),
    (dict(x=torch.zeros(MAX_ROWS + 1, 8)), f"at most {MAX_ROWS} rows"),
    (dict(x=torch.zeros(1, 6)), "x [M, K]"),
])
def test_the_product_refuses_what_it_cannot_take(bad, message):
    args = dict(x=torch.zeros(1, 8), w8=torch.zeros(4, 8, dtype=FP8), scale=torch.ones(4))
    args.update(bad)
    with pytest.raises(ValueError) as e:
        fp8_logits(**args)
    assert message in str(e.value)


_INTERPRETED = """
import json
from triton.runtime.interpreter import InterpretedFunction
from mtpserve.kernels import fp8_head_triton
import fp8_head_check
assert isinstance(fp8_head_triton._fp8_logits_kernel, InterpretedFunction)
print("RESULT " + json.dumps({"kernel": fp8_head_check.check_kernel("cpu"),
                              "head": fp8_head_check.check_head()}))
"""


def test_the_kernel_under_triton_interpreter_matches_the_reference():
    """One row (multiply-and-sum) and 3 / 16 rows (tl.dot), float32 and bf16 x, two tile
    shapes, reductions of 256 and 80 inputs (the tile's inputs past 80 masked, the weight's
    columns past K NaN): within 1e-5 of the largest logit of the PyTorch reference; and the
    FP8 head's greedy ids through the kernel and the argmax kernel (tests/fp8_head_check.py)."""
    import json

    res = json.loads(run_interpreted(_INTERPRETED, timeout=300))
    assert len(res["kernel"]) == 24 and all(e < 1e-5 for e in res["kernel"].values())
    # the head through the kernel and the argmax kernel: ids of the reference's argmax, the
    # subset's mapped back into the vocabulary
    assert len(res["head"]) == 4 and len(res["head"]["fr-spec rows=5"]) == 5
    assert set(res["head"]["fr-spec rows=5"]) <= set(SUBSET)


@pytest.mark.parametrize("rows", [1, 4])
def test_the_kernel_compiles_for_hopper(rows):
    from mtpserve.kernels import fp8_head_triton as fh

    tiles = fh.ONE_ROW_TILES if rows == 1 else fh.ROWS_TILES
    try:
        meta = compile_for_hopper(rows, tiles)
    except RuntimeError as e:              # no ptxas / LLVM backend in this Triton install
        if "ptxas" in str(e).lower():
            pytest.skip(str(e))
        raise
    assert meta["num_warps"] == tiles[2]


# ---- the head ------------------------------------------------------------------------------
@pytest.mark.parametrize("subset", [None, SUBSET], ids=["full", "fr-spec"])
def test_greedy_ids_are_the_argmax_of_the_fp8_logits_and_logits_stay_exact(subset):
    lm = lm_head()
    target = target_of(lm)
    ids = None if subset is None else torch.tensor(subset)
    head = build_draft_head(target, ids, "fp8")
    base = head.base
    assert isinstance(head, Fp8GreedyHead)
    assert isinstance(base, FullVocabHead if subset is None else ReducedVocabHead)
    assert head.w8.shape == (V if subset is None else len(subset), H)
    assert head.nbytes() == head.w8.shape[0] * (H + 4)
    hidden = torch.randn(9, H, generator=torch.Generator().manual_seed(3))
    fp8 = fp8_logits_torch(hidden, head.w8, head.scale)
    want = fp8.argmax(-1) if subset is None else torch.tensor(sorted(subset))[fp8.argmax(-1)]
    assert head.greedy(hidden).tolist() == want.tolist()
    assert torch.equal(head.logits(hidden), base.logits(hidden))
    # where the unquantized head's two best are far apart the FP8 draft is the same token
    exact = base.logits(hidden)
    top2 = exact.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.5
    assert clear.sum() >= 5
    assert head.greedy(hidden)[clear].tolist() == base.greedy(hidden)[clear].tolist()


def test_more_rows_than_the_kernel_takes_go_to_the_unquantized_head():
    lm = lm_head()
    head = Fp8GreedyHead(FullVocabHead(target_of(lm)))
    hidden = torch.randn(MAX_ROWS + 1, H, generator=torch.Generator().manual_seed(4))
    assert head.greedy(hidden).tolist() == lm(hidden).argmax(-1).tolist()


def test_without_quantization_the_heads_are_as_before():
    lm = lm_head()
    assert isinstance(build_draft_head(target_of(lm), None), FullVocabHead)
    assert isinstance(build_draft_head(target_of(lm), torch.tensor(SUBSET)), ReducedVocabHead)


# ---- the engine ----------------------------------------------------------------------------
@pytest.mark.usefixtures("one_thread_module")
@pytest.mark.parametrize("with_map", [False, True], ids=["full", "fr-spec"])
def test_greedy_output_equals_plain_decoding_and_the_copy_is_reserved(ckpt, with_map,
                                                                      monkeypatch):
    """Lossless: the same tokens as without speculation. The runner keeps the FP8 copy's bytes
    (a byte a weight, a float32 scale a row; with the map also its own float32 rows) out of the
    KV budget, and the chain's drafts go through the FP8 product."""
    import mtpserve.spec.draft_head as draft_head

    path, hot = ckpt
    plain = token_ids(LLM(str(path), **KW), prompts())
    llm = LLM(str(path), speculative_algorithm="nextn", speculative_num_steps=K,
              speculative_adaptive=False, speculative_draft_head_quantization="fp8",
              speculative_token_map=hot if with_map else None, **KW)
    eng = llm.engine
    calls, product = [], draft_head.fp8_logits
    monkeypatch.setattr(draft_head, "fp8_logits",
                        lambda x, *a, **kw: calls.append(x.shape[0]) or product(x, *a, **kw))
    assert token_ids(llm, prompts()) == plain
    hidden = eng.model_config.hidden_size
    rows = 100 if with_map else 256
    own = 100 * hidden * 4 if with_map else 0
    assert eng.runner.reserve_bytes == own + rows * (hidden + 4)
    head = eng.proposer.head
    assert isinstance(head, Fp8GreedyHead) and eng.proposer.chain.head is head
    assert head.w8.shape == (rows, hidden) and len(calls) > 20


def trained_run(ps, quantization: str | None):
    """(outputs, accepted draft tokens) of greedy MTP decoding of ``ps`` on the trained tiny
    checkpoint, every step drafting min(k, room)."""
    llm = trained_llm(speculative_draft_head_quantization=quantization)
    outs = [r.outputs[0] for r in llm.generate(ps, TRAINED_GREEDY)]
    return outs, sum(o.spec.num_accepted_tokens for o in outs)


@pytest.mark.usefixtures("one_thread_module")
def test_acceptance_on_the_trained_model_stays_within_a_few_drafts():
    """The FP8 head drafts what the float32 one drafts but where their best two tokens are
    close: the output is identical and the accepted drafts within 10% (on these prompts)."""
    ps = held_out_prompts(8, 6)[:4]
    outs, accepted = trained_run(ps, None)
    outs8, accepted8 = trained_run(ps, "fp8")
    assert [o.token_ids for o in outs8] == [o.token_ids for o in outs]
    assert accepted >= 30
    assert abs(accepted8 - accepted) <= 0.1 * accepted


def test_the_flag_needs_an_mtp_proposer():
    from mtpserve.engine_args import add_engine_args, engine_config_from_args

    with pytest.raises(ValueError) as e:
        SpeculativeConfig(algorithm="ngram", draft_head_quantization="fp8")
    assert "needs --speculative-algorithm nextn or mtp" in str(e.value)
    with pytest.raises(ValueError) as e:
        SpeculativeConfig(algorithm="nextn", draft_head_quantization="int4")
    assert "must be fp8" in str(e.value)
    import argparse

    p = argparse.ArgumentParser()
    add_engine_args(p)
    with pytest.raises(ValueError) as e:
        engine_config_from_args(p.parse_args(["--speculative-draft-head-quantization", "fp8"]))
    assert "needs --speculative-algorithm nextn" in str(e.value)
    cfg = engine_config_from_args(p.parse_args(["--speculative-algorithm", "nextn",
                                                "--speculative-draft-head-quantization", "fp8"]))
    assert cfg.speculative.draft_head_quantization == "fp8"


@pytest.mark.parametrize("capability, refused", [((8, 6), True), ((8, 9), False),
                                                 ((9, 0), False)])
def test_fp8_needs_compute_capability_8_9_on_cuda(capability, refused, monkeypatch):
    """The E4M3 conversions exist from Ada (8.9) on: an older GPU is refused at start, with the
    flag named; a newer one gets the FP8 head (the head built here on the CPU weights)."""
    from types import SimpleNamespace

    from mtpserve.spec import _draft_head

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    lm = lm_head()
    engine = SimpleNamespace(token_map=None, device=torch.device("cuda", 0),
                             runner=SimpleNamespace(model=target_of(lm)),
                             model_config=SimpleNamespace(vocab_size=V, hidden_size=H))
    spec = SpeculativeConfig(algorithm="nextn", draft_head_quantization="fp8")
    if refused:
        with pytest.raises(ValueError) as e:
            _draft_head(spec, engine)
        assert "--speculative-draft-head-quantization fp8 needs a GPU of compute capability " \
               "8.9" in str(e.value)
    else:
        assert isinstance(_draft_head(spec, engine), Fp8GreedyHead)
