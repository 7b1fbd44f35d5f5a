"""Make a token map for ``--speculative-token-map`` (FR-Spec): the N most frequent token ids.

The corpus is tokenized with the model's tokenizer (no special tokens added, so no BOS), each id
is counted, and the ids are ranked by count, descending, ties to the lower id; ids the corpus
never holds follow in id order. Without a corpus the map is therefore the first ids of the
vocabulary (BPE vocabularies are ordered roughly by merge order, i.e. by frequency), a weaker
guess. The ids that end an answer always come first and count among the N, so drafts can propose
the end of an answer: the model's EOS ids (config and tokenizer, the ids the engine stops on) and
the special tokens the chat template closes an assistant turn with (e.g. ``<|im_end|>``).

Corpus files, told apart by the name:

- ``.txt``: UTF-8 plain text, the whole file one text;
- ``.jsonl``: one JSON object per line (blank lines skipped); its texts are the string values of
  the fields "text", "prompt", "completion" and "content", and the string "content" of each
  object in an OpenAI-style "messages" list; other fields and values are ignored.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

from mtpserve.jsonl import read_objects

TEXT_FIELDS = ("text", "prompt", "completion", "content")
CORPUS_SUFFIXES = (".txt", ".jsonl")
OUTPUT_SUFFIXES = (".json", ".pt")
BATCH_TEXTS = 256   # texts per tokenizer call (the fast tokenizer runs a batch in parallel)
_SENTINEL = "mtpserve-token-map-answer"

DESCRIPTION = (
    "Write a --speculative-token-map file (FR-Spec): the N token ids that are most frequent in "
    "--corpus when tokenized with the model's tokenizer (ties to the lower id), else the first N "
    "ids of the vocabulary. The EOS ids and the special tokens the chat template ends a turn "
    "with are always in the map (they count among the N). Corpus files: .txt (the whole file is "
    "one text) or .jsonl (one JSON object a line; the string fields " + ", ".join(TEXT_FIELDS) +
    " and each messages[*].content string).")


@dataclass(frozen=True)
class TokenMap:
    """A built map: ``ids`` ascending; ``tokens`` corpus tokens counted; ``covered`` how many
    of them are in ``ids`` (both 0 without a corpus); ``vocab_size`` the model's."""

    ids: list[int]
    tokens: int
    covered: int
    vocab_size: int

    def summary(self, output: str) -> str:
        """One line: ids, tokens counted, coverage in percent of the corpus tokens, the path."""
        cover = f"{100 * self.covered / self.tokens:.2f}%" if self.tokens else "n/a (no corpus)"
        return (f"token map: {len(self.ids)} ids, {self.tokens} corpus tokens counted, "
                f"coverage {cover} -> {output}")


def check_paths(corpus: Iterable[str], output: str) -> None:
    """Fail before any work on a bad name.

    Raises:
        ValueError: ``output`` not ``.json`` / ``.pt``, or a corpus file not ``.txt`` / ``.jsonl``.
        FileNotFoundError: a corpus file, or the folder of ``output``, does not exist.
        ValueError: ``output`` names an existing folder.
    """
    out = Path(output)
    if out.suffix.lower() not in OUTPUT_SUFFIXES:
        raise ValueError(f"--output {output}: the name must end in .json (a list of ints) or .pt "
                         f"(a 1-D int64 tensor)")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"--output {output}: no such folder: {out.parent}")
    if out.is_dir():
        raise ValueError(f"--output {output}: is a folder; give a file name")
    for path in corpus:
        if not Path(path).is_file():
            raise FileNotFoundError(f"--corpus: no such file: {path}")
        if Path(path).suffix.lower() not in CORPUS_SUFFIXES:
            raise ValueError(f"--corpus {path}: the name must end in .txt (plain text) or .jsonl")


def record_texts(record: dict) -> list[str]:
    """The texts of one JSONL record: its string ``TEXT_FIELDS`` values, in that order, then the
    string ``content`` of each dict in a ``messages`` list, in order."""
    texts = [record[k] for k in TEXT_FIELDS if isinstance(record.get(k), str)]
    messages = record.get("messages")
    if isinstance(messages, list):
        texts += [m["content"] for m in messages
                  if isinstance(m, dict) and isinstance(m.get("content"), str)]
    return texts


def _jsonl_texts(path: str) -> Iterator[str]:
    """Every record's texts, line by line. Raises ValueError naming ``path:line`` for a line
    that is not a JSON object."""
    for _, record in read_objects(path, label="--corpus "):
        yield from record_texts(record)


def corpus_texts(paths: Iterable[str]) -> Iterator[str]:
    """The texts of the corpus files, file by file (format by name, see the module docstring).

    Raises:
        ValueError: a bad JSONL line (``path:line`` in the message), or a file not UTF-8.
    """
    for path in paths:
        try:
            if Path(path).suffix.lower() == ".jsonl":
                yield from _jsonl_texts(path)
            else:
                yield Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"--corpus {path}: not UTF-8 text ({e.reason} at byte "
                             f"{e.start})") from None


def _batches(items: Iterable[str], n: int) -> Iterator[list[str]]:
    it = iter(items)
    while batch := list(islice(it, n)):
        yield batch


def count_tokens(tokenizer, texts: Iterable[str]) -> Counter:
    """How often each token id occurs in ``texts`` (tokenized without special tokens), with a
    progress bar on a terminal (stderr)."""
    from tqdm import tqdm

    counts: Counter = Counter()
    with tqdm(desc="tokenizing", unit=" texts", disable=None) as bar:
        for batch in _batches(texts, BATCH_TEXTS):
            for ids in tokenizer(batch, add_special_tokens=False, verbose=False)["input_ids"]:
                counts.update(ids)
            bar.update(len(batch))
    return counts


def turn_end_ids(tokenizer) -> set[int]:
    """The special token ids the chat template writes after an assistant message's content
    (e.g. ``<|im_end|>``); empty when the tokenizer has no usable template."""
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False)
    except Exception:   # no template, or one that refuses this chat: nothing to add
        return set()
    if not isinstance(text, str) or _SENTINEL not in text:
        return set()
    tail = tokenizer.encode(text[text.rindex(_SENTINEL) + len(_SENTINEL):],
                            add_special_tokens=False)
    special = set(tokenizer.all_special_ids)
    special |= {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return {i for i in tail if i in special}


def end_ids(tokenizer, eos_token_ids: Iterable[int]) -> list[int]:
    """The ids that end an answer, ascending: ``eos_token_ids`` (the model config's), the
    tokenizer's EOS and :func:`turn_end_ids`."""
    ids = set(eos_token_ids) | turn_end_ids(tokenizer)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def rank_ids(counts: Counter, vocab_size: int, size: int, first: Iterable[int] = ()) -> list[int]:
    """``size`` ids of ``[0, vocab_size)``: those of ``first`` inside the vocabulary, then the
    rest by count descending, ties (zero counts included) to the lower id."""
    head = [i for i in dict.fromkeys(first) if 0 <= i < vocab_size]
    taken = set(head)
    ranked = sorted((i for i in range(vocab_size) if i not in taken), key=lambda i: (-counts[i], i))
    return (head + ranked)[:size]


def build_token_map(files, size: int, corpus: Iterable[str] = ()) -> TokenMap:
    """The map of ``size`` ids for a loaded model (``files``: a ``ModelFiles``; the vocabulary
    size and EOS ids are the engine's, ``ModelConfig.from_hf``) from the ``corpus`` files.

    Raises:
        ValueError: ``size`` outside ``1..vocab_size``; a bad corpus file; a corpus without
            any token.
    """
    from mtpserve.config import ModelConfig

    mc = ModelConfig.from_hf(files.hf_config)
    if not 1 <= size <= mc.vocab_size:
        raise ValueError(f"--size {size}: must be in 1..{mc.vocab_size} (the vocabulary size)")
    corpus = list(corpus)
    counts = count_tokens(files.tokenizer, corpus_texts(corpus)) if corpus else Counter()
    if corpus and not counts:
        raise ValueError(f"--corpus: no text in {', '.join(corpus)} (JSONL fields read: "
                         f"{', '.join(TEXT_FIELDS)}, messages[*].content)")
    ids = rank_ids(counts, mc.vocab_size, size, end_ids(files.tokenizer, mc.eos_token_ids))
    return TokenMap(sorted(ids), counts.total(), sum(counts[i] for i in ids), mc.vocab_size)


def write_token_map(ids: list[int], output: str) -> None:
    """Write ``ids`` to ``output``: ``.json`` a list of ints, ``.pt`` a 1-D int64 tensor
    (``torch.save``, as SGLang's hot-token files)."""
    if Path(output).suffix.lower() == ".pt":
        import torch

        torch.save(torch.tensor(ids, dtype=torch.int64), output)
    else:
        Path(output).write_text(json.dumps(ids) + "\n", encoding="utf-8")


def make_token_map(model: str | None, tokenizer: str | None, size: int, output: str,
                   corpus: Iterable[str] = ()) -> TokenMap:
    """Load ``model`` (None: the default model) and its tokenizer (or ``tokenizer``), build the
    map, write it to ``output`` and read it back with ``load_token_map``; return it.

    Raises:
        ValueError, FileNotFoundError: bad names (:func:`check_paths`), a model that does not
            load, or :func:`build_token_map`'s errors.
    """
    from mtpserve.loader import load_model_files
    from mtpserve.spec.token_map import load_token_map

    corpus = list(corpus)
    check_paths(corpus, output)
    files = load_model_files(model, tokenizer)
    token_map = build_token_map(files, size, corpus)
    write_token_map(token_map.ids, output)
    load_token_map(output, token_map.vocab_size)
    return token_map
