"""``mtpserve token-map`` (spec/token_map_build.py) over a tiny word-level checkpoint: exact ids."""

from __future__ import annotations

import json

import pytest
import torch

from mtpserve.cli import main
from mtpserve.spec.token_map import load_token_map
from mtpserve.spec.token_map_build import record_texts

VOCAB = 32   # the config's vocabulary; the tokenizer's words are w1..w15, </s> = 9, <eot> = 16
EOS, EOT = 9, 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """config.json (llama, vocab 32, EOS 9), a placeholder model.safetensors (never read: the
    command loads config and tokenizer only) and a word tokenizer whose chat template ends each
    turn with the special token <eot> (id 16)."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from mtpserve.bench.random_model import word_tokenizer

    path = tmp_path_factory.mktemp("tiny")
    AutoConfig.for_model("llama", vocab_size=VOCAB, hidden_size=8, intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=2,
                         eos_token_id=EOS).save_pretrained(path)
    save_file({"placeholder": torch.zeros(1)}, str(path / "model.safetensors"))
    tok = word_tokenizer(16, eos_id=EOS)
    tok.add_special_tokens({"additional_special_tokens": ["<eot>"]})
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} <eot> {% endfor %}"
    tok.save_pretrained(path)
    return path


@pytest.fixture
def corpus(tmp_path):
    """12 tokens: w3 x3, w5 x3 (seen before w4), w4 x3, w2 x2, w7 x1; the field "other" and the
    non-string "content" of a message are not read."""
    txt = tmp_path / "a.txt"
    txt.write_text("w3 w5 w3 w5\nw2 w2 w3 w7\n")
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text(json.dumps({"text": "w5", "other": "w15 w15 w15 w15",
                                 "messages": [{"role": "user", "content": "w4 w4"},
                                              {"role": "user", "content": ["w15"]},
                                              {"role": "assistant", "content": "w4"}]})
                     + "\n\n")
    return [str(txt), str(jsonl)]


def run(model_dir, *args) -> int:
    return main(["token-map", "--model", str(model_dir), *map(str, args)])


@pytest.mark.parametrize("suffix", [".json", ".pt"])
def test_corpus_map_exact(model_dir, corpus, tmp_path, capsys, suffix):
    out = tmp_path / f"map{suffix}"
    assert run(model_dir, "--size", 4, "--output", out, "--corpus", *corpus) == 0
    # EOS 9 and <eot> 16 first, then the top counts 3, 4, 5 tied at 3: the lower ids 3 and 4
    want = [3, 4, EOS, EOT]
    if suffix == ".json":
        assert json.loads(out.read_text()) == want
    else:
        got = torch.load(out, weights_only=True)
        assert got.dtype == torch.int64 and got.tolist() == want
    assert load_token_map(str(out), VOCAB).tolist() == want
    assert capsys.readouterr().out == (f"token map: 4 ids, 12 corpus tokens counted, "
                                       f"coverage 50.00% -> {out}\n")


def test_corpus_smaller_than_map_fills_in_id_order(model_dir, corpus, tmp_path):
    out = tmp_path / "map.json"
    assert run(model_dir, "--size", 9, "--output", out, "--corpus", *corpus) == 0
    # 5 counted ids + the 2 end ids, then ids never seen, lowest first: 0, 1
    assert json.loads(out.read_text()) == [0, 1, 2, 3, 4, 5, 7, EOS, EOT]


def test_no_corpus_first_ids_plus_end_ids(model_dir, tmp_path, capsys):
    out = tmp_path / "map.json"
    assert run(model_dir, "--size", 5, "--output", out) == 0
    assert json.loads(out.read_text()) == [0, 1, 2, EOS, EOT]
    captured = capsys.readouterr()
    assert captured.out == (f"token map: 5 ids, 0 corpus tokens counted, "
                            f"coverage n/a (no corpus) -> {out}\n")
    assert "a corpus like the traffic you serve gives a better map" in captured.err


def test_whole_vocabulary(model_dir, tmp_path):
    out = tmp_path / "map.pt"
    assert run(model_dir, "--size", VOCAB, "--output", out) == 0
    assert load_token_map(str(out), VOCAB).tolist() == list(range(VOCAB))


def test_record_texts_fields():
    record = {"text": "t", "prompt": "p", "completion": "c", "content": "x", "other": "no",
              "messages": [{"role": "system", "content": "s"}, {"content": None}, "bare",
                           {"role": "user", "content": [{"type": "text", "text": "part"}]},
                           {"role": "assistant", "content": "a"}]}
    assert record_texts(record) == ["t", "p", "c", "x", "s", "a"]
    assert record_texts({"text": 3, "messages": "m"}) == []


@pytest.mark.parametrize("args, lines, message", [
    (["--size", 0], None, "--size 0: must be in 1..32 (the vocabulary size)"),
    (["--size", VOCAB + 1], None, "--size 33: must be in 1..32"),
    (["--size", 4, "--corpus", "missing.txt"], None, "--corpus: no such file: "),
    (["--size", 4, "--corpus", "c.jsonl"], ['{"text": "w2"}', "", "{oops"], "c.jsonl:3: not JSON"),
    (["--size", 4, "--corpus", "c.jsonl"], ['["w2"]'], "c.jsonl:1: a JSON list, not an object"),
    (["--size", 4, "--corpus", "c.jsonl"], ['{"title": "w2"}'], "--corpus: no text in "),
    (["--size", 4, "--corpus", "c.csv"], ["w2"],
     "the name must end in .txt (plain text) or .jsonl"),
])
def test_errors_exit_2(model_dir, tmp_path, capsys, args, lines, message):
    name = next((a for a in args if isinstance(a, str) and "." in a), None)
    if lines is not None:
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    args = [tmp_path / a if a == name else a for a in args]
    assert run(model_dir, *args, "--output", tmp_path / "map.json") == 2
    err = capsys.readouterr().err
    assert err.startswith("mtpserve token-map: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "map.json").exists()


@pytest.mark.parametrize("output, message", [
    ("map.txt", "the name must end in .json (a list of ints) or .pt"),
    ("no/such/map.json", "no such folder"),
    ("folder.json", "is a folder; give a file name"),
])
def test_bad_output_exit_2(model_dir, tmp_path, capsys, output, message):
    (tmp_path / "folder.json").mkdir()
    assert run(model_dir, "--size", 4, "--output", tmp_path / output) == 2
    err = capsys.readouterr().err
    assert err.startswith("mtpserve token-map: ") and message in err
