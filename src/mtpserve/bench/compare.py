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


def _ratios(s_off: dict, s_on: dict) -> dict:
    """on / off per ``RATIO_FIELDS`` name of two level summaries (None where missing)."""
    return {name: _ratio(value(s_on, key, sub), value(s_off, key, sub))
            for name, key, sub in RATIO_FIELDS}


def compare_runs(off: dict, on: dict) -> list[dict]:
    """Per concurrency present in both runs: ``{"concurrency", "off", "on", "ratio"}``, each a
    dict over ``RATIO_FIELDS`` names (``ratio`` = on / off of the pooled summaries; None where
    a value is missing), plus ``on["acceptance_length"]``. When both levels ran in rounds
    (``--rounds``), also ``round_ratios``: the ratios of round k of one against round k of the
    other, in order."""
    off_levels = {lv["concurrency"]: lv for lv in off["levels"]}
    rows = []
    for lv in on["levels"]:
        c, s_on = lv["concurrency"], lv["summary"]
        lv_off = off_levels.get(c)
        if lv_off is None:
            continue
        s_off = lv_off["summary"]
        row = {"concurrency": c, "off": {}, "on": {}, "ratio": _ratios(s_off, s_on),
               "acceptance_length": s_on.get("acceptance_length")}
        for name, key, sub in RATIO_FIELDS:
            row["off"][name] = value(s_off, key, sub)
            row["on"][name] = value(s_on, key, sub)
        if "rounds" in lv and "rounds" in lv_off:
            row["round_ratios"] = [_ratios(a, b) for a, b in zip(lv_off["rounds"], lv["rounds"])]
        rows.append(row)
    return rows
