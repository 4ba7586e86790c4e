"""The swarm benchmark's figures: mean job completion time against the KV budget, one
line per policy, and the blocks in use over time at one budget, one panel per policy.
SVG and PNG, with matplotlib (imported only here, as ``kvgov.memory_map`` does)."""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvgov.benchmarks.swarm.result import RunResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["COLORS", "footnote", "plot", "save_figure"]

COLORS = {
    "paged": "#d62728",
    "paged+offload": "#8c564b",
    "ttl-pin": "#ff7f0e",
    "intercept": "#9467bd",
    "kvgov": "#2ca02c",
}


def plot(results: Sequence[RunResult], out: Path, *, fraction: float, note: str) -> list[Path]:
    """``swarm-jct`` and ``swarm-blocks`` (``.svg`` and ``.png``) in ``out``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    policies = list(dict.fromkeys(r.policy for r in results))
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(7, 4.2))
    try:
        for policy in policies:
            fractions = sorted({r.fraction for r in results if r.policy == policy})
            jct = [
                statistics.median(
                    r.jct_mean_s for r in results if r.policy == policy and r.fraction == f
                )
                for f in fractions
            ]
            ax.plot(fractions, jct, marker="o", label=policy, color=COLORS.get(policy))
        ax.set_xlabel("KV budget (fraction of every agent's peak context at once)")
        ax.set_ylabel("mean job time (s, median of rounds)")
        ax.set_xscale("log")
        # Each budget's blocks under its fraction: a floor (twice the largest agent's
        # peak) can make two fractions nearly the same budget.
        budget_blocks = {r.fraction: r.num_blocks for r in results}
        fractions = sorted(budget_blocks)
        ax.set_xticks(fractions, [f"{f:g}\n{budget_blocks[f]:,} blocks" for f in fractions])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
        ax.set_title("Swarm job completion time by KV budget", fontsize=11)
        fig.tight_layout(rect=(0, footnote(fig, note), 1, 1))
        written += save_figure(fig, out / "swarm-jct")
    finally:
        plt.close(fig)

    at = [r for r in results if r.fraction == fraction and r.round == 0]
    fig, axes = plt.subplots(len(at), 1, figsize=(7, 1.6 * len(at) + 0.8), sharex=True)
    try:
        for ax, run in zip(axes if len(at) > 1 else [axes], at, strict=True):
            times = [t for t, _ in run.timeline]
            blocks = [b for _, b in run.timeline]
            ax.step(times, blocks, where="post", color=COLORS.get(run.policy), lw=1)
            ax.axhline(run.num_blocks, color="#333333", lw=0.8, ls="--")
            ax.set_ylim(0, run.num_blocks * 1.08)
            ax.set_ylabel("blocks", fontsize=8)
            ax.set_title(
                f"{run.policy}: peak {run.peak_blocks} of {run.num_blocks} blocks, "
                f"makespan {run.makespan_s:.1f} s",
                fontsize=9,
                loc="left",
            )
        (axes[-1] if len(at) > 1 else axes).set_xlabel("time since the run started (s)")
        fig.suptitle(
            f"Blocks in use at a KV budget of {fraction:g} (dashed: the pool)", fontsize=11
        )
        fig.tight_layout()
        written += save_figure(fig, out / "swarm-blocks")
    finally:
        plt.close(fig)
    return written


def footnote(fig: Any, note: str) -> float:
    """``note`` in small print along the bottom of ``fig``, wrapped until it fits the
    figure's width as drawn (fonts differ in width between machines); the fraction of
    the height it takes, to keep the axes above it."""
    width = int(125 * fig.get_figwidth() / 7)  # characters a line, at 6.5 pt
    text = fig.text(0.01, 0.01, textwrap.fill(note, width), fontsize=6.5, color="#555555")
    renderer = fig.canvas.get_renderer()
    while text.get_window_extent(renderer).x1 > 0.99 * fig.bbox.x1 and width > 20:
        width -= 5
        text.set_text(textwrap.fill(note, width))
    lines = text.get_text().count("\n") + 1
    return (lines * 6.5 * 1.3 / 72 + 0.1) / fig.get_figheight()


def save_figure(fig: Figure, base: Path) -> list[Path]:
    paths = [base.with_suffix(".svg"), base.with_suffix(".png")]
    for path in paths:
        fig.savefig(path)
    return paths
