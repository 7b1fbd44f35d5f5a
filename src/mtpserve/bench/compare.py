"""Speculation on vs off: the ratio (on / off) of each headline number per concurrency."""

from __future__ import annotations

import math
import statistics

# (name, summary key, sub-key): the numbers compared; higher is better for the tok/s ones,
# lower for the latencies
RATIO_FIELDS = (
    ("per_request_tok_s", "per_request_tok_s", "mean"),
    ("total_tok_s", "total_tok_s", None),
    ("ttft_p50", "ttft_ms", "p50"),
    ("tpot_p50", "tpot_ms", "p50"),
)


# Student's t, two-sided 95%: the 0.975 quantile for 1..30 degrees of freedom; beyond 30 the
# value at 30 (larger than the exact one, so the interval is a little wider, never narrower)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def ratio_interval(ratios: list[float]) -> tuple[float, float, float] | None:
    """The geometric mean of per-round on/off ratios and its 95% confidence interval
    ``(mean, low, high)``: a t interval on the log ratios (the rounds taken as independent
    samples of one machine's noise). None for fewer than two ratios or one that is missing,
    not positive or not finite."""
    if len(ratios) < 2 or any(r is None or not 0 < r < math.inf for r in ratios):
        return None
    logs = [math.log(r) for r in ratios]
    n, mean = len(logs), statistics.fmean(logs)
    t = _T975[min(n - 1, len(_T975)) - 1]
    half = t * statistics.stdev(logs) / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def verdict(interval: tuple[float, float, float] | None) -> str:
    """"on faster" / "on slower" when the 95% interval of on/off (tok/s) excludes 1, else
    "within noise"; "-" without an interval."""
    if interval is None:
        return "-"
    _, low, high = interval
    return "on faster" if low > 1 else "on slower" if high < 1 else "within noise"


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
    other, in order, and ``round_interval``: per name, :func:`ratio_interval` of those."""
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
            row["round_interval"] = {name: ratio_interval([r[name] for r in row["round_ratios"]])
                                     for name, *_ in RATIO_FIELDS}
        rows.append(row)
    return rows
