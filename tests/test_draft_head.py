"""The FR-Spec draft head (spec/draft_head.py) and its token map files (spec/token_map.py): the
reduced head's greedy ids and full-vocabulary logits against the target's LM head, every
validation error of ``--speculative-token-map``, and the flag itself."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from harness_draft_head import SUBSET, H, V, lm_head, target_of
from mtpserve.cli import main
from mtpserve.config import SpeculativeConfig
from mtpserve.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from mtpserve.spec.draft_head import FullVocabHead, ReducedVocabHead, build_draft_head
from mtpserve.spec.token_map import load_token_map


def masked(full: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """``full`` [N, V] with every column outside ``ids`` set to -inf."""
    out = torch.full_like(full, float("-inf"))
    out[:, ids] = full[:, ids]
    return out


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "mkl-packed"])
def test_greedy_ids_are_the_argmax_of_the_masked_full_logits(packed):
    lm = lm_head(packed)
    head = ReducedVocabHead(lm, torch.tensor(SUBSET))
    hidden = torch.randn(7, H, generator=torch.Generator().manual_seed(1))
    want = masked(lm(hidden), SUBSET)
    top2 = want.topk(2, dim=-1).values
    assert ((top2[:, 0] - top2[:, 1]) > 1e-3).all()   # no near-tie: the ids are well defined
    ids = head.greedy(hidden)
    assert ids.dtype == torch.int64 and ids.shape == (7,)
    assert ids.tolist() == want.argmax(-1).tolist()
    assert set(ids.tolist()) <= set(SUBSET)


def test_greedy_ties_break_to_the_lowest_id_like_the_full_argmax():
    lm = lm_head()
    hidden = torch.randn(2, H, generator=torch.Generator().manual_seed(2))
    lm.weight.data[150] = lm.weight.data[5] = 4 * hidden[0]   # 150 listed before 5 in SUBSET
    head = ReducedVocabHead(lm, torch.tensor(SUBSET))
    assert masked(lm(hidden), SUBSET)[0].argmax().item() == 5
    assert head.greedy(hidden)[0].item() == 5


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "mkl-packed"])
def test_full_logits_are_minus_inf_exactly_outside_the_subset(packed):
    lm = lm_head(packed)
    head = ReducedVocabHead(lm, torch.tensor(SUBSET))
    hidden = torch.randn(5, H, generator=torch.Generator().manual_seed(3))
    out = head.logits(hidden)
    assert out.dtype == torch.float32 and out.shape == (5, V)
    outside = torch.ones(V, dtype=torch.bool)
    outside[SUBSET] = False
    assert torch.isneginf(out[:, outside]).all()
    assert torch.isfinite(out[:, SUBSET]).all()
    # inside: the reduced logits, column for column, bit for bit ...
    assert torch.equal(out[:, head.ids], head.reduced_logits(hidden))
    assert head.ids.tolist() == sorted(SUBSET)
    # ... which are the target's logits up to float32 summation order (MKL may block the
    # product of a [12, H] weight differently from a [200, H] one)
    torch.testing.assert_close(out[:, SUBSET], lm(hidden)[:, SUBSET], rtol=0, atol=1e-5)


def test_weight_is_a_contiguous_copy_of_the_rows_tied_embedding_untouched():
    embed = VocabParallelEmbedding(V, H)
    embed.weight.data.copy_(torch.randn(V, H, generator=torch.Generator().manual_seed(4)))
    lm = ParallelLMHead(V, H)
    lm.weight = embed.weight                      # tie_word_embeddings, as models do
    before = embed.weight.detach().clone()
    head = ReducedVocabHead(lm, torch.tensor(SUBSET, dtype=torch.int32))
    assert head.weight.is_contiguous() and head.weight.shape == (len(SUBSET), H)
    assert head.weight.data_ptr() != embed.weight.data_ptr()
    assert torch.equal(head.weight, before[sorted(SUBSET)])
    head.weight.zero_()
    assert torch.equal(embed.weight, before)
    assert head.ids.dtype == torch.int64


def test_bfloat16_weight_keeps_its_dtype_and_logits_are_float32():
    lm = lm_head().to(torch.bfloat16)
    head = ReducedVocabHead(lm, torch.tensor(SUBSET))
    assert head.weight.dtype == torch.bfloat16
    hidden = torch.randn(2, H, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    assert head.logits(hidden).dtype == torch.float32


def test_tensor_parallel_head_is_refused():
    sharded = SimpleNamespace(tp_size=2, weight=torch.zeros(V // 2, H), vocab_size=V)
    with pytest.raises(ValueError, match=r"not supported with tensor parallelism \(TP = 2\)"):
        ReducedVocabHead(sharded, torch.tensor(SUBSET))


def test_no_token_map_means_the_targets_own_head():
    lm = lm_head()
    target = target_of(lm)
    head = build_draft_head(target, None)
    hidden = torch.randn(3, H, generator=torch.Generator().manual_seed(5))
    assert isinstance(head, FullVocabHead)
    assert torch.equal(head.logits(hidden), lm(hidden))
    assert torch.equal(head.greedy(hidden), lm(hidden).argmax(-1))
    assert isinstance(build_draft_head(target, torch.tensor(SUBSET)), ReducedVocabHead)


# ---- token map files ----------------------------------------------------------------------
def test_pt_and_json_files_give_the_ids_in_file_order(tmp_path):
    torch.save(torch.tensor(SUBSET, dtype=torch.int32), tmp_path / "m.pt")
    (tmp_path / "m.json").write_text(json.dumps(SUBSET))
    for name in ("m.pt", "m.json"):
        ids = load_token_map(str(tmp_path / name), V)
        assert ids.dtype == torch.int64 and ids.tolist() == SUBSET


def _write(tmp_path, name: str, content) -> str:
    p = tmp_path / name
    if name.endswith(".pt") and not isinstance(content, bytes):
        torch.save(content, p)
    elif isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content)
    return str(p)


BAD_FILES = {
    "garbage.pt": (b"not a zip or pickle", "cannot read it"),
    "broken.json": ("[1, 2", "cannot read it: JSONDecodeError"),
    "latin1.json": (b"[\xff]", "cannot read it: UnicodeDecodeError"),
    "map.txt": ("1 2 3", "the name must end in .pt (a 1-D integer tensor) or .json"),
    "empty.json": ("[]", "the token map is empty"),
    "empty.pt": (torch.zeros(0, dtype=torch.int64), "the token map is empty"),
    "float.json": ("[1, 2.5]", "holds the non-integer 2.5; token ids must be integers"),
    "bool.json": ("[1, true]", "holds the non-integer True; token ids must be integers"),
    "string.json": ('["7"]', "holds the non-integer '7'; token ids must be integers"),
    "dict.json": ('{"ids": [1]}', "holds a dict; need a 1-D integer tensor (.pt) or a list"),
    "float.pt": (torch.tensor([1.0, 2.0]), "holds a torch.float32 tensor; token ids must be"),
    "2d.pt": (torch.tensor([[1, 2], [3, 4]]), "holds a tensor of shape [2, 2]; need a 1-D"),
    "dup.json": ("[3, 4, 3, 9, 9, 9]", "token id 3 appears 2 times; each id may appear once"),
    "dup.pt": (torch.tensor([9, 9, 9, 4]), "token id 9 appears 3 times"),
    "big.json": (f"[0, {V}]", f"token id {V} is outside the vocabulary [0, {V})"),
    "neg.pt": (torch.tensor([4, -1]), f"token id -1 is outside the vocabulary [0, {V})"),
    "huge.json": ("[1, 100000000000000000000]", "token id 100000000000000000000 is outside"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_bad_token_map_files_name_the_problem(tmp_path, name):
    content, message = BAD_FILES[name]
    path = _write(tmp_path, name, content)
    with pytest.raises(ValueError) as e:
        load_token_map(path, V)
    assert str(e.value).startswith(f"--speculative-token-map: {path}: ")
    assert message in str(e.value)


def test_missing_token_map_file(tmp_path):
    with pytest.raises(ValueError, match="--speculative-token-map: no such file: .*nope.json"):
        load_token_map(str(tmp_path / "nope.json"), V)


# ---- config and flag ----------------------------------------------------------------------
@pytest.mark.parametrize("algo, why", [("ngram", " (n-gram drafts have no LM head)"),
                                       ("draft", ""), ("forced_accept", "")])
def test_token_map_needs_the_mtp_proposer(algo, why):
    kw = {"draft_model_path": "self"} if algo == "draft" else {}
    with pytest.raises(ValueError) as e:
        SpeculativeConfig(algo, token_map="m.json", **kw)
    assert str(e.value) == ("--speculative-token-map restricts the LM head of MTP drafts: it "
                            f"needs --speculative-algorithm nextn or mtp, got {algo!r}{why}")
    assert SpeculativeConfig("mtp", token_map="m.json").token_map == "m.json"
    assert SpeculativeConfig("nextn").token_map is None


def test_flag_parses_into_the_config():
    import argparse

    from mtpserve.engine_args import add_engine_args, engine_config_from_args

    p = argparse.ArgumentParser()
    add_engine_args(p)
    a = p.parse_args(["--speculative-algorithm", "nextn", "--speculative-token-map", "/m/hot.pt"])
    assert engine_config_from_args(a).speculative.token_map == "/m/hot.pt"
    a = p.parse_args(["--speculative-algorithm", "nextn"])
    assert engine_config_from_args(a).speculative.token_map is None


def test_cli_rejects_the_flag_without_an_algorithm(capsys):
    rc = main(["generate", "--prompt", "x", "--speculative-token-map", "hot.json"])
    assert rc == 2
    assert capsys.readouterr().err == ("mtpserve generate: --speculative-token-map needs "
                                       "--speculative-algorithm nextn (or mtp): the map "
                                       "restricts the MTP drafts' LM head\n")


def test_cli_rejects_the_flag_with_ngram_before_loading_anything(capsys):
    rc = main(["generate", "--prompt", "x", "--speculative-algorithm", "ngram",
               "--speculative-token-map", "hot.json"])
    assert rc == 2
    assert "mtpserve generate: --speculative-token-map restricts the LM head of MTP drafts" \
        in capsys.readouterr().err


def test_kv_sizing_reserves_the_draft_heads_bytes(tmp_path):
    """spec.draft_head_bytes: what memory_profile.gpu_kv_blocks keeps back (the runner's
    ``reserve_bytes``) for the FR-Spec head built after the KV cache is sized: map rows x hidden
    x dtype bytes; 0 without a map."""
    from mtpserve.spec import draft_head_bytes

    (tmp_path / "m.json").write_text(json.dumps([5, 9, 2]))
    ids = load_token_map(str(tmp_path / "m.json"), 16)
    assert draft_head_bytes(ids, 24, torch.bfloat16) == 3 * 24 * 2
    assert draft_head_bytes(None, 24, torch.bfloat16) == 0
