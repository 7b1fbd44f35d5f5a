"""``results.json``: the configuration, where it ran, every run's raw request records and
summaries, and the on/off comparison.

Top-level keys: ``schema`` ("mtpserve-bench/1"), ``meta`` (see ``meta.run_metadata``: date,
version, git commit, host), ``config`` (the bench options), ``runs`` (list: ``label``, ``url``,
``model``, ``model_path``, ``server_flags``, ``levels``: [{``concurrency``, ``summary``,
``requests``}]), ``comparison`` (None, or ``compare.compare_runs``'s rows).
"""

from __future__ import annotations

import json
import os

SCHEMA = "mtpserve-bench/1"


def results_doc(config: dict, meta: dict, runs: list[dict], comparison: list[dict] | None) -> dict:
    return {"schema": SCHEMA, "meta": meta, "config": config, "runs": runs,
            "comparison": comparison}


def write_json(doc: dict, output_dir: str) -> str:
    """Write ``output_dir/results.json`` (creating the folder); returns its path."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "results.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return path
