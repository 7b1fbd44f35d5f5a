"""``results.png``: per-request and total tokens/s against concurrency, one line per run
(speculation off and on when comparing). Needs matplotlib (the ``bench`` extra); Agg backend."""

from __future__ import annotations


def plot_runs(runs: list[dict], path: str, title: str = "") -> None:
    """Write the PNG to ``path``.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'mtpserve[bench]'``).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = ((axes[0], "per-request tok/s (mean)", lambda s: s["per_request_tok_s"]["mean"]),
              (axes[1], "total tok/s", lambda s: s["total_tok_s"]))
    for ax, name, get in panels:
        for run in runs:
            conc = [lv["concurrency"] for lv in run["levels"]]
            ys = [get(lv["summary"]) for lv in run["levels"]]
            ax.plot(conc, [float("nan") if y is None else y for y in ys], marker="o",
                    label=run["label"])
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({lv["concurrency"] for r in runs for lv in r["levels"]}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("concurrency")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
