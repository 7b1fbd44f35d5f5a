"""Speculation on vs off: the ratio (on / off) of each headline number per concurrency."""

from __future__ import annotations

# (name, summary key, sub-key): the numbers compared; higher is better for the tok/s ones,
# lower for the latencies
RATIO_FIELDS = (
    ("per_request_tok_s", "per_request_tok_s", "mean"),
    ("total_tok_s", "total_tok_s", None),
    ("ttft_p50", "ttft_ms", "p50"),
    ("tpot_p50", "tpot_ms", "p50"),
)


def value(summary: dict, key: str, sub: str | None) -> float | None:
    """``summary[key][sub]`` (or ``summary[key]``), None when absent."""
    v = summary.get(key)
    return v.get(sub) if sub is not None and isinstance(v, dict) else v


def _ratio(on: float | None, off: float | None) -> float | None:
    return on / off if on is not None and off else None


def compare_runs(off: dict, on: dict) -> list[dict]:
    """Per concurrency present in both runs: ``{"concurrency", "off", "on", "ratio"}``, each a
    dict over ``RATIO_FIELDS`` names (``ratio`` = on / off; None where a value is missing),
    plus ``on["acceptance_length"]``."""
    off_levels = {lv["concurrency"]: lv["summary"] for lv in off["levels"]}
    rows = []
    for lv in on["levels"]:
        c, s_on = lv["concurrency"], lv["summary"]
        s_off = off_levels.get(c)
        if s_off is None:
            continue
        row = {"concurrency": c, "off": {}, "on": {}, "ratio": {},
               "acceptance_length": s_on.get("acceptance_length")}
        for name, key, sub in RATIO_FIELDS:
            row["off"][name] = value(s_off, key, sub)
            row["on"][name] = value(s_on, key, sub)
            row["ratio"][name] = _ratio(row["on"][name], row["off"][name])
        rows.append(row)
    return rows
