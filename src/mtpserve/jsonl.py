"""Reading JSON Lines files (one JSON object a line): benchmark prompt sets (bench/dataset.py)
and token-map corpora (spec/token_map_build.py)."""

from __future__ import annotations

import json
from typing import Iterator


def read_objects(path: str, label: str = "") -> Iterator[tuple[str, dict]]:
    """Each non-blank line of ``path`` as (``"{label}{path}:{line number}"``, the object).

    Raises:
        FileNotFoundError: no such file (on the first ``next``).
        ValueError: a line that is not JSON, or JSON but not an object (the message starts with
            its ``label path:line``).
    """
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{label}{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: a JSON {type(record).__name__}, not an object")
            yield where, record
