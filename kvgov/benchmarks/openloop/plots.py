"""The open-loop panel's figures as pictures: mean and p99 job time against arrival rate,
each policy's median over the evaluation seeds with its 95% bootstrap band
(``stats.band_over``: every rate read over the same resampled seeds), and where job
time goes, one stacked bar per policy at each rate (``PanelFigures.breakdown``). SVG
and PNG, with matplotlib (imported only here, as ``swarm.plot`` does)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvgov.benchmarks.openloop import stats
from kvgov.benchmarks.openloop.budgets import BudgetFigures
from kvgov.benchmarks.openloop.figures import PanelFigures
from kvgov.benchmarks.swarm.breakdown import PARTS
from kvgov.benchmarks.swarm.plot import COLORS, footnote, save_figure

__all__ = ["plot", "plot_budgets"]

# One colour a part, from the tools (light: not the memory policy's) to decode.
_PART_COLORS = {
    "tool": "#c7c7c7",
    "workers": "#e5e5e5",
    "admission": "#ff9896",
    "queue": "#d62728",
    "prefill": "#aec7e8",
    "recompute": "#ff7f0e",
    "swap": "#9467bd",
    "decode": "#1f77b4",
}


def plot(figures: PanelFigures, out: Path, *, note: str = "") -> list[Path]:
    """``openloop-jct-<suffix>`` and ``openloop-breakdown-<suffix>`` (``.svg`` and
    ``.png``) in ``out``; the paths written."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    rates = list(figures.rates)
    written: list[Path] = []
    title = figures.runs.panel.title
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharex=True)
    try:
        for ax, figure, label in (
            (axes[0], "jct_mean", "mean job time (s)"),
            (axes[1], "jct_p99", "p99 job time (s)"),
        ):
            for policy in figures.policies:
                per_seed = {rate: figures.per_seed(policy, rate, figure) for rate in rates}
                curves = {s: [per_seed[r][s] for r in rates] for s in figures.seeds}
                _band_line(ax, rates, curves, policy)
            if len(rates) > 1 and max(rates) >= 4 * min(rates):
                ax.set_xscale("log")  # a sweep from below saturation to well past it
                ax.set_xticks(rates, [f"{rate:g}" for rate in rates])
                ax.minorticks_off()
            ax.set_xlabel("teams arriving a minute (Poisson)")
            ax.set_ylabel(f"{label}, median of seeds")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(
            f"Job time against load, 95% bands over {len(figures.seeds)} seeds\n{title}",
            fontsize=9,
        )
        fig.tight_layout(rect=(0, footnote(fig, note), 1, 0.92) if note else (0, 0, 1, 0.92))
        written += save_figure(fig, out / f"openloop-jct-{figures.suffix}")
    finally:
        plt.close(fig)

    policies = list(figures.policies)
    width = max(7.0, 3.2 * len(rates) + 1.5)
    fig, axes = plt.subplots(1, len(rates), figsize=(width, 4.8), sharey=True)
    axes = axes if len(rates) > 1 else [axes]
    try:
        for ax, rate in zip(axes, rates, strict=True):
            bottoms = [0.0] * len(policies)
            for part in PARTS:
                heights = [figures.breakdown(policy, rate)[part] for policy in policies]
                ax.bar(
                    range(len(policies)),
                    heights,
                    bottom=bottoms,
                    color=_PART_COLORS[part],
                    label=part,
                    width=0.7,
                )
                bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
            ax.set_xticks(range(len(policies)), policies, rotation=35, ha="right", fontsize=8)
            ax.set_title(f"{rate:g} teams/min", fontsize=9)
            ax.grid(alpha=0.3, axis="y")
        axes[0].set_ylabel("mean job time (s), mean of seeds")
        axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.suptitle(f"Where job time goes\n{title}", fontsize=9)
        fig.tight_layout(rect=(0, footnote(fig, note), 1, 0.92) if note else (0, 0, 1, 0.92))
        written += save_figure(fig, out / f"openloop-breakdown-{figures.suffix}")
    finally:
        plt.close(fig)
    return written


def plot_budgets(figures: BudgetFigures, out: Path, *, note: str = "") -> list[Path]:
    """``openloop-goodput-budget-<suffix>`` (``.svg`` and ``.png``) in ``out``: each
    policy's goodput against the KV memory it was given, median of seeds with the 95%
    band read over the same resampled seeds at every budget; the paths written."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    shares = sorted(figures.runs)
    gb = [figures.kv_gb(share) for share in shares]
    fig, ax = plt.subplots(figsize=(7, 5.2))
    try:
        for policy in figures.policies:
            per_share = {share: figures.goodput(policy, share) for share in shares}
            curves = {s: [per_share[share][s] for share in shares] for s in figures.seeds}
            _band_line(ax, gb, curves, policy)
        ax.set_xlabel("KV memory the engine is given (GB)")
        ax.set_ylabel("goodput (jobs/min), median of seeds")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        title = figures.runs[shares[-1]].panel.title
        fig.suptitle(
            f"Goodput against the KV budget at {figures.rate:g} teams/min, 95% bands over "
            f"{len(figures.seeds)} seeds\n{title}",
            fontsize=9,
        )
        fig.tight_layout(rect=(0, footnote(fig, note), 1, 0.9) if note else (0, 0, 1, 0.9))
        return save_figure(fig, out / f"openloop-goodput-budget-{figures.suffix}")
    finally:
        plt.close(fig)


def _band_line(
    ax: Any, xs: Sequence[float], curves: Mapping[int, list[float]], policy: str
) -> None:
    """One policy's median over the seeds at each x, with its 95% band read over the same
    resampled seeds at every x (``stats.band_over``; ``curves``: seed -> its values)."""
    band = stats.band_over(curves)
    color = COLORS.get(policy)
    ax.plot(xs, [b.value for b in band], marker="o", label=policy, color=color)
    ax.fill_between(xs, [b.low for b in band], [b.high for b in band], color=color, alpha=0.15)
