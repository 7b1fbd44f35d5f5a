"""Plain-text tables for the terminal: one per run, and the on/off comparison."""

from __future__ import annotations

from mtpserve.bench.compare import RATIO_FIELDS, ratio_interval, verdict

# (header, summary key, sub-key, format)
COLUMNS = (
    ("conc", "concurrency", None, "d"),
    ("reqs", "num_requests", None, "d"),
    ("err", "num_errors", None, "d"),
    ("out tok", "output_tokens", None, "d"),
    ("wall s", "wall_s", None, ".2f"),
    ("tok/s/req", "per_request_tok_s", "mean", ".2f"),
    ("total tok/s", "total_tok_s", None, ".2f"),
    ("TTFT p50", "ttft_ms", "p50", ".1f"),
    ("TTFT p99", "ttft_ms", "p99", ".1f"),
    ("ITL p50", "itl_ms", "p50", ".1f"),
    ("ITL p99", "itl_ms", "p99", ".1f"),
    ("TPOT p50", "tpot_ms", "p50", ".1f"),
    ("TPOT p99", "tpot_ms", "p99", ".1f"),
    ("accept len", "acceptance_length", None, ".3f"),
)


def fmt(x, spec: str) -> str:
    """``format(x, spec)``, or ``-`` for None."""
    return "-" if x is None else format(x, spec)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Right-aligned columns, two spaces apart, with a rule under the header."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(headers), "  ".join("-" * w for w in widths),
                      *(line(r) for r in rows)])


def _cell(summary: dict, key: str, sub: str | None, spec: str) -> str:
    v = summary.get(key)
    return fmt(v.get(sub) if sub is not None and isinstance(v, dict) else v, spec)


def run_table(run: dict) -> str:
    """The title line and one row per concurrency of a run (times in ms)."""
    flags = " ".join(run.get("server_flags") or []) or "-"
    title = (f"== {run['label']}: model {run['model']} at {run['url']}  (server flags: {flags})"
             "\n   times in ms; tok/s/req: mean over requests; accept len: tokens per verify step")
    rows = [[_cell(lv["summary"], key, sub, spec) for _, key, sub, spec in COLUMNS]
            for lv in run["levels"]]
    return title + "\n" + table([h for h, *_ in COLUMNS], rows)


def compare_table(rows: list[dict]) -> str:
    """Off, on and on/off per headline number and concurrency."""
    headers = ["conc"]
    for name, *_ in RATIO_FIELDS:
        headers += [f"{name} off", "on", "on/off"]
    headers.append("accept len")
    body = []
    for row in rows:
        cells = [str(row["concurrency"])]
        for name, *_ in RATIO_FIELDS:
            ratio = row["ratio"][name]
            cells += [fmt(row["off"][name], ".2f"), fmt(row["on"][name], ".2f"),
                      "-" if ratio is None else f"{ratio:.3f}x"]
        cells.append(fmt(row["acceptance_length"], ".3f"))
        body.append(cells)
    title = ("== speculation on vs off (tok/s: higher is better; TTFT/TPOT in ms: lower is "
             "better)")
    text = title + "\n" + table(headers, body)
    if any("round_ratios" in row for row in rows):
        text += "\n" + _rounds_table(rows)
    return text


def _rounds_table(rows: list[dict]) -> str:
    """Per concurrency, the on/off ratio of each round (``--rounds``) for the tok/s numbers,
    their geometric mean with its 95% interval, and whether that tells on from off."""
    names = [name for name, *_ in RATIO_FIELDS if name.endswith("tok_s")]
    body = []
    for row in rows:
        for name in names:
            ratios = [r[name] for r in row.get("round_ratios", [])]
            ci = ratio_interval(ratios)
            body.append([str(row["concurrency"]), name,
                         "  ".join("-" if x is None else f"{x:.3f}x" for x in ratios),
                         "-" if ci is None else f"{ci[0]:.3f}x ({ci[1]:.3f}-{ci[2]:.3f})",
                         verdict(ci)])
    return ("== on/off by round (servers in turns: off on, on off, ...)\n"
            + table(["conc", "number", "on/off per round", "mean (95% interval)", "verdict"],
                    body))
