"""``render(report)``: a ``RunReport`` as rich tables, for ``kvgov report`` to print.

Four parts: one row per agent (leases, calls, context p50/p95/max, ceiling now and
advised), one row per agent of what the policies did (compactions and summarizations
with the tokens they saved, the share of its context tool results brought), the run as a
whole (peaks, admission waits, held KV, preemptions, the budget and ``max_concurrent``),
and the levers, numbered, the first marked as the one to pull first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from integrations.report.run_report import RunReport

__all__ = ["render"]


def render(report: RunReport) -> RenderableType:
    workflows = ", ".join(sorted(set(report.workflows))) or "no run span"
    title = Text.assemble(
        ("kvgov report", "bold"), f" {report.source}: {workflows}, {report.num_leases} leases"
    )
    return Group(title, _agents(report), _policies(report), _run(report), _levers(report))


def _agents(report: RunReport) -> Table:
    table = Table(
        title="Context per lease (its deepest, in tokens)", title_justify="left", pad_edge=False
    )
    headers = ("agent", "leases", "failed", "calls", "p50", "p95", "max", "ceiling", "advised")
    for header in headers:
        table.add_column(header, justify="left" if header == "agent" else "right")
    for a in report.agents:
        c = a.context_tokens
        table.add_row(
            a.agent,
            str(a.num_leases),
            str(a.num_failed),
            str(a.num_calls),
            f"{c.p50:,.0f}",
            f"{c.p95:,.0f}",
            f"{c.max:,.0f}",
            f"{a.ceiling_tokens:,}",
            f"{a.recommended_ceiling:,}",
        )
    return table


def _policies(report: RunReport) -> Table:
    table = Table(title="What the policies did (tokens saved)", title_justify="left")
    for header in ("agent", "compactions", "saved", "summarized", "saved", "tool share"):
        table.add_column(header, justify="left" if header == "agent" else "right")
    for a in report.agents:
        table.add_row(
            a.agent,
            str(a.compactions),
            f"{a.compaction_tokens_saved:,}",
            str(a.summarizations),
            f"{a.summarize_tokens_saved:,}",
            f"{a.tool_share:.0%}",
        )
    return table


def _run(report: RunReport) -> Table:
    table = Table(title="Run", title_justify="left", show_header=False)
    table.add_column("figure")
    table.add_column("value")
    wait = report.admission_wait_s
    rows = [
        ("peak concurrent leases", str(report.peak_leases)),
        ("peak active leases", str(report.peak_active_leases)),
        (
            "admission waits (s)",
            f"{wait.count} admissions; p50 {wait.p50:.3f}, p95 {wait.p95:.3f}, max {wait.max:.3f}",
        ),
        ("compactions", f"{report.compactions} ({report.compaction_tokens_saved:,} tokens)"),
        (
            "summarizations",
            f"{report.summarizations} ({report.summarize_tokens_saved:,} tokens saved)",
        ),
        (
            "held KV",
            f"{report.offloads} offloads ({report.offloaded_blocks:,} blocks), "
            f"{report.restores} restores, {report.drops} drops",
        ),
        ("engine preemptions", str(report.preemptions)),
        ("failed leases", _failed(report)),
        ("failed runs", _listed(report.run_failures)),
    ]
    budget = report.budget
    if budget is not None:
        rows.append(
            (
                "KV budget",
                f"{budget.num_available_blocks:,} of {budget.num_blocks:,} blocks x "
                f"{budget.block_size} tokens, safety {budget.safety_factor:g}, {budget.mode}",
            )
        )
        rows.append(
            (
                "max_concurrent",
                f"{report.max_concurrent_now} at the largest ceiling now, "
                f"{report.max_concurrent_recommended} at the largest recommended",
            )
        )
    else:
        rows.append(("KV budget", "not recorded (no run span): no max_concurrent"))
    for figure, value in rows:
        table.add_row(figure, value)
    return table


def _levers(report: RunReport) -> Table:
    table = Table(title="Levers, first one first", title_justify="left", show_header=False)
    table.add_column("#", justify="right")
    table.add_column("lever")
    for number, lever in enumerate(report.levers, start=1):
        action = Text(lever.action, style="bold" if number == 1 else "")
        table.add_row(str(number), Text.assemble(action, "\n", (lever.reason, "dim")))
    return table


def _failed(report: RunReport) -> str:
    """``none``, or how many leases ended in error, by error type, over every agent."""
    failed: dict[str, int] = {}
    for agent in report.agents:
        for kind, count in agent.failures:
            failed[kind] = failed.get(kind, 0) + count
    return _listed(tuple(sorted(failed.items(), key=lambda item: (-item[1], item[0]))))


def _listed(failures: tuple[tuple[str, int], ...]) -> str:
    if not failures:
        return "none"
    total = sum(count for _, count in failures)
    return f"{total} ({', '.join(f'{kind} {count}' for kind, count in failures)})"
