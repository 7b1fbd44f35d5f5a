"""Token map files for ``--speculative-token-map``: the "hot" token ids of a reduced draft head.

FR-Spec (Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via
Frequency-Ranked Speculative Sampling", arXiv 2502.14856) restricts the draft's LM head to the
most frequent tokens; SGLang reads them from the file named by ``--speculative-token-map``.
Two formats, told apart by the file name:

- ``.pt``: a 1-D integer tensor saved with ``torch.save`` (SGLang's format; read with
  ``weights_only=True``, so a file cannot run code);
- ``.json``: a list of ints, e.g. ``[0, 1, 2, 17]``.

The order of the ids does not matter (the draft head sorts them).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

FLAG = "--speculative-token-map"


def load_token_map(path: str, vocab_size: int) -> torch.Tensor:
    """The ids in ``path`` as a 1-D int64 CPU tensor [V_sub], in file order.

    Raises:
        ValueError: the file is missing or unreadable, has another extension, or holds
            something other than a non-empty list of distinct integer ids in
            ``[0, vocab_size)`` (the message names the flag, the file and the problem).
    """
    p, where = Path(path), f"{FLAG}: {path}"
    if not p.is_file():
        raise ValueError(f"{FLAG}: no such file: {path}")
    suffix = p.suffix.lower()
    if suffix not in (".pt", ".json"):
        raise ValueError(f"{where}: the name must end in .pt (a 1-D integer tensor) or .json "
                         f"(a list of ints)")
    try:
        if suffix == ".pt":
            obj = torch.load(p, map_location="cpu", weights_only=True)
        else:
            obj = json.loads(p.read_text(encoding="utf-8"))
    except Exception as e:   # unpickling, zip, UTF-8, JSON, OS errors: all mean "unreadable"
        raise ValueError(f"{where}: cannot read it: {type(e).__name__}: {e}") from e
    return check_token_ids(_as_tensor(obj, where), vocab_size, where)


def _as_tensor(obj, where: str) -> torch.Tensor:
    """A loaded tensor or list of ints as a tensor.

    Raises:
        ValueError: anything else, or a list with a non-integer (bools and floats included).
    """
    if isinstance(obj, torch.Tensor):
        return obj
    if not isinstance(obj, list):
        raise ValueError(f"{where}: holds a {type(obj).__name__}; need a 1-D integer tensor "
                         f"(.pt) or a list of ints")
    bad = next((x for x in obj if type(x) is not int), None)
    if bad is not None:
        raise ValueError(f"{where}: holds the non-integer {bad!r}; token ids must be integers")
    huge = next((x for x in obj if not -2**63 <= x < 2**63), None)
    if huge is not None:
        raise ValueError(f"{where}: token id {huge} is outside the vocabulary (not an int64)")
    return torch.tensor(obj, dtype=torch.int64)


def check_token_ids(ids: torch.Tensor, vocab_size: int, where: str = "token map") -> torch.Tensor:
    """``ids`` (1-D integer tensor, any device) checked, as int64 (same device).

    Raises:
        ValueError: not integer, not 1-D, empty, a duplicate id, or an id outside
            ``[0, vocab_size)`` (the message starts with ``where`` and names the first
            offending id).
    """
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"{where}: holds a {ids.dtype} tensor; token ids must be integers")
    if ids.dim() != 1:
        raise ValueError(f"{where}: holds a tensor of shape {list(ids.shape)}; need a 1-D "
                         f"tensor of token ids")
    if ids.numel() == 0:
        raise ValueError(f"{where}: the token map is empty")
    ids = ids.to(torch.int64)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.numel():
        raise ValueError(f"{where}: token id {int(bad[0])} is outside the vocabulary "
                         f"[0, {vocab_size})")
    values, counts = ids.unique(return_counts=True)
    if bool((counts > 1).any()):
        dup = int(values[counts > 1][0])
        raise ValueError(f"{where}: token id {dup} appears {int(counts[values == dup])} times; "
                         f"each id may appear once")
    return ids
