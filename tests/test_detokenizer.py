"""Incremental detokenizer on the real SmolLM2 tokenizer (byte-level BPE): release by release."""

from __future__ import annotations

import os
import random

import pytest

from mtpserve.engine.detokenizer import IncrementalDetokenizer
from mtpserve.loader.default_model import default_model_path

FFFD = "\ufffd"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    path = default_model_path()
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.fixture(scope="module")
def prompt(tok):
    return tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def stream(tok, prompt, ids, stop=(), include=False, skip=True):
    """Feed ``ids`` one by one; return (text taken after each token, (index, stop) of the match
    or None, text from finish(), the detokenizer)."""
    d = IncrementalDetokenizer(tok, prompt, skip, list(stop), include)
    takes, match = [], None
    for i, t in enumerate(ids):
        m = d.append(t)
        takes.append(d.take_new_text())
        if m is not None:
            match = (i, m)
            break
    return takes, match, d.finish(), d


def pieces(tok, ids):
    return [tok.convert_ids_to_tokens(i) for i in ids]


# ---- plain decoding, release by release ------------------------------------------------------

def test_english_one_word_per_release(tok, prompt):
    ids = tok.encode("Hello world, how are you?")
    takes, match, rest, d = stream(tok, prompt, ids)
    assert takes == ["Hello", " world", ",", " how", " are", " you", "?"]
    assert (match, rest, d.text) == (None, "", "Hello world, how are you?")


def test_code_whitespace_kept_exactly(tok, prompt):
    ids = tok.encode("def f(x):\n    return  x\t+1\n\n")
    takes, _, rest, _ = stream(tok, prompt, ids)
    assert takes == ["def", " f", "(", "x", "):", "\n   ", " return", " ", " x", "\t", "+", "1",
                     "\n\n"]
    assert rest == ""


def test_emoji_bytes_split_over_tokens_are_held_until_whole(tok, prompt):
    ids = tok.encode("🙂👍🏽")
    # 🙂 = F0 9F|99 82, 👍 = F0 9F|91|8D, 🏽 = F0 9F|8F|BD
    assert pieces(tok, ids) == ["ðŁ", "ĻĤ", "ðŁ", "ĳ", "į", "ðŁ", "ı", "½"]
    takes, _, rest, _ = stream(tok, prompt, ids)
    assert takes == ["", "🙂", "", "", "👍", "", "", "🏽"]
    assert rest == ""


def test_space_before_a_split_character_is_released_at_once(tok, prompt):
    ids = tok.encode(" café 😀")
    assert pieces(tok, ids) == ["ĠcafÃ©", "ĠðŁĺ", "Ģ"]
    takes, _, _, _ = stream(tok, prompt, ids)
    assert takes == [" café", " ", "😀"]


def test_cjk_and_accented_text(tok, prompt):
    cjk = tok.encode("中文字符测试")
    assert pieces(tok, cjk)[3:5] == ["ç¬", "¦"]  # 符 = E7 AC|A6
    assert stream(tok, prompt, cjk)[0] == ["中", "文", "字", "", "符", "", "测", "", "试"]
    accented = tok.encode("Ich möchte Käse")
    assert stream(tok, prompt, accented)[0] == ["I", "ch", " m", "ö", "ch", "te", " K", "ä", "se"]


def test_special_tokens_skipped_or_kept(tok, prompt):
    ids = tok.encode("end.<|im_end|>\n")
    assert ids[2] == 2  # <|im_end|>
    assert stream(tok, prompt, ids, skip=True)[0] == ["end", ".", "", "\n"]
    assert stream(tok, prompt, ids, skip=False)[0] == ["end", ".", "<|im_end|>", "\n"]


class _StripLeadingSpaceTokenizer:
    """SentencePiece-style stand-in: pieces use U+2581 for a space and decode drops the space at
    the very start of the text (as Llama's decoder does)."""

    pieces = ["\u2581Hi", "\u2581there", "\u2581Hello", "!"]

    def decode(self, ids, skip_special_tokens=True):
        text = "".join(self.pieces[i] for i in ids).replace("\u2581", " ")
        return text[1:] if text.startswith(" ") else text


def test_first_token_gets_its_leading_space_from_the_prompt():
    stub = _StripLeadingSpaceTokenizer()
    assert stub.decode([2, 3]) == "Hello!"
    assert stream(stub, [0, 1], [2, 3])[0] == [" Hello", "!"]
    assert stream(stub, [], [2, 3])[0] == ["Hello", "!"]


def test_dangling_partial_character_released_by_finish(tok, prompt):
    ids = tok.encode("🙂")[:1]  # F0 9F alone
    takes, _, rest, d = stream(tok, prompt, ids)
    assert takes == [""]
    assert rest == FFFD == tok.decode(ids)
    assert d.text == FFFD


def test_prompt_ending_inside_a_character(tok, prompt):
    head, tail = tok.encode("🙂")  # the prompt ends with F0 9F; the output starts with 99 82
    takes, _, rest, _ = stream(tok, prompt + [head], [tail, 19556])  # then "Hello"
    assert "".join(takes) + rest == tok.decode([tail, 19556])
    assert takes[-1].endswith("Hello") and FFFD in takes[-1]


# ---- stop strings ----------------------------------------------------------------------------

def test_stop_inside_one_token(tok, prompt):
    ids = tok.encode("Hello world, how are you?")
    takes, match, rest, d = stream(tok, prompt, ids, stop=["wor"])
    assert (takes, match, rest, d.text) == (["Hello", " "], (1, "wor"), "", "Hello ")
    takes, match, _, d = stream(tok, prompt, ids, stop=["wor"], include=True)
    assert (takes, match, d.text) == (["Hello", " wor"], (1, "wor"), "Hello wor")


def test_stop_spanning_two_tokens_is_held_back(tok, prompt):
    ids = tok.encode("Hello world, how are you?")
    assert stream(tok, prompt, ids, stop=["lo wo"])[:2] == (["Hel", ""], (1, "lo wo"))
    assert stream(tok, prompt, ids, stop=["lo wo"], include=True)[0] == ["Hel", "lo wo"]


def test_stop_spanning_three_tokens(tok, prompt):
    ids = tok.encode("Hello world, how are you?")
    takes, match, rest, d = stream(tok, prompt, ids, stop=["w are y"])
    assert takes == ["Hello", " world", ",", " ho", "", ""]
    assert (match, rest, d.text) == ((5, "w are y"), "", "Hello world, ho")


def test_stop_at_the_very_first_token(tok, prompt):
    ids = tok.encode("Hello world")
    assert stream(tok, prompt, ids, stop=["Hello"])[:3] == ([""], (0, "Hello"), "")
    assert stream(tok, prompt, ids, stop=["Hello"], include=True)[0] == ["Hello"]


def test_partial_stop_released_when_it_stops_matching(tok, prompt):
    ids = tok.encode("Hello world, how are you?")
    takes, match, _, _ = stream(tok, prompt, ids[:3], stop=["world peace"])
    assert (takes, match) == (["Hello", " ", "world,"], None)


def test_partial_stop_at_the_end_released_by_finish(tok, prompt):
    ids = tok.encode("Hello world, how are you?")
    takes, match, rest, d = stream(tok, prompt, ids, stop=["?!"])
    assert takes[-2:] == [" you", ""]
    assert (match, rest, d.text) == (None, "?", "Hello world, how are you?")


def test_overlapping_stops_in_one_token_shortest_end_wins(tok, prompt):
    ids = tok.encode(" abc")
    assert len(ids) == 1
    for stops in (["abc", "ab"], ["ab", "abc"]):
        assert stream(tok, prompt, ids, stop=stops)[:2] == ([" "], (0, "ab"))
    assert stream(tok, prompt, ids, stop=["abc", "ab"], include=True)[0] == [" ab"]


def test_shared_prefix_of_two_stops_held_then_released(tok, prompt):
    ids = tok.encode(" ab") + tok.encode(" c")
    takes, match, rest, _ = stream(tok, prompt, ids, stop=["abx", "abc"])
    assert (takes, match, rest) == ([" ", "ab c"], None, "")


def test_stops_ending_together_longest_wins(tok, prompt):
    ids = tok.encode("tabcd")
    assert pieces(tok, ids) == ["tab", "cd"]
    stops = ["bcd", "abc", "tabc"]  # abc and tabc end at 4, bcd at 5
    assert stream(tok, prompt, ids, stop=stops)[:2] == (["", ""], (1, "tabc"))
    assert stream(tok, prompt, ids, stop=stops, include=True)[0] == ["", "tabc"]


def test_stop_made_of_split_characters_matches_on_the_completing_token(tok, prompt):
    ids = tok.encode("中文字符测试")
    takes, match, _, d = stream(tok, prompt, ids, stop=["符测"])
    assert (takes, match, d.text) == (["中", "文", "字", "", "", "", ""], (6, "符测"), "中文字")
    assert stream(tok, prompt, ids, stop=["符测"], include=True)[0][-1] == "符测"


def test_stop_on_special_token_text_only_when_not_skipped(tok, prompt):
    ids = tok.encode("end.<|im_end|>\n")
    assert stream(tok, prompt, ids, stop=["<|im_end|>"], skip=False)[:2] == (
        ["end", ".", ""], (2, "<|im_end|>"))
    assert stream(tok, prompt, ids, stop=["<|im_end|>"], skip=True)[1] is None


def test_stop_not_searched_in_the_prompt(tok, prompt):
    ids = tok.encode(" Hello")
    assert stream(tok, prompt, ids, stop=["assistant"])[:2] == ([" Hello"], None)


def test_append_after_stop_raises_and_empty_stop_rejected(tok, prompt):
    _, _, _, d = stream(tok, prompt, tok.encode("Hello world"), stop=["Hello"])
    with pytest.raises(RuntimeError, match="after the detokenizer stopped"):
        d.append(905)
    with pytest.raises(ValueError, match="non-empty"):
        IncrementalDetokenizer(tok, prompt, True, [""], False)


# ---- invariants over many sequences ----------------------------------------------------------

def _check_prefixes(takes, rest, full):
    joined = ""
    for piece in takes:
        joined += piece
        assert full.startswith(joined)  # never a split character, never text taken back
    assert joined + rest == full


def test_random_token_sequences_join_to_decode(tok, prompt):
    rng = random.Random(0)
    vocab = len(tok)
    for _ in range(150):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 16))]
        for skip in (True, False):
            takes, match, rest, _ = stream(tok, prompt, ids, skip=skip)
            assert match is None
            _check_prefixes(takes, rest, tok.decode(ids, skip_special_tokens=skip))


CORPUS = ("The quick brown fox — jumps over 😀 the lazy dog. 日本語のテキスト. naïve café; "
          "def f(x):\n\treturn x**2  # ok\n<|im_end|> 🙂👍🏽 Käse")


def _expected_cut(full, stops, include):
    """``full`` cut at the stop match that ends first (the longest one on ties)."""
    best = None
    for s in stops:
        i = full.find(s)
        if i >= 0 and (best is None or (i + len(s), -len(s)) < best[0]):
            best = ((i + len(s), -len(s)), i, s)
    if best is None:
        return full, None
    _, i, s = best
    return (full[: i + len(s)] if include else full[:i]), s


def test_random_stops_cut_at_first_occurrence(tok, prompt):
    rng = random.Random(1)
    matched = 0
    for _ in range(300):
        a = rng.randrange(len(CORPUS))
        ids = tok.encode(CORPUS[a: a + rng.randrange(5, 50)])
        skip, include = rng.random() < 0.5, rng.random() < 0.5
        full = tok.decode(ids, skip_special_tokens=skip)
        whole = full.rstrip(FFFD)
        if not whole:
            continue
        starts = [rng.randrange(len(whole)) for _ in range(rng.randrange(1, 3))]
        stops = [whole[x: x + rng.randrange(1, 6)] for x in starts] + ["zq"]
        takes, match, rest, _ = stream(tok, prompt, ids, stop=stops, include=include, skip=skip)
        want, stop = _expected_cut(full, stops, include)
        _check_prefixes(takes, rest, want)
        if stop is not None:
            # the match is reported on the first token whose whole-character text contains it
            first = next(j for j in range(len(ids)) if stop in
                         tok.decode(ids[: j + 1], skip_special_tokens=skip).rstrip(FFFD))
            assert match == (first, stop)
            matched += 1
        else:
            assert match is None
    assert matched > 200
