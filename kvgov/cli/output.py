"""What every ``kvgov`` command prints the same way: bad input as one line on stderr with
exit code 2 (``fail``), measurements as a table (``measurement_table``), and the host's
load beside each figure (``host_figures``)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich import box
from rich.table import Table

from kvgov.tables import MIN_NOTE

if TYPE_CHECKING:
    from engine.benchmarks import Measurement

__all__ = ["fail", "format_number", "host_figures", "measurement_table"]


def fail(message: str) -> NoReturn:
    """A one-line error on stderr and exit code 2: bad input never prints a traceback."""
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code=2)


def host_figures() -> dict[str, Any]:
    """What else the host was running, as figures printed beside each result: on a shared
    machine a figure read under load is not one read on a quiet host."""
    return {"load_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}


def measurement_table(measurements: Iterable[Measurement]) -> Table:
    """Measurements as the CLI prints them: figure, unit, target and whether it was met."""
    from engine.benchmarks import Direction

    # Figures never wrap or get cut; names fold and notes wrap to fit narrow terminals.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("bench", overflow="fold")
    table.add_column("metric", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("unit", no_wrap=True)
    table.add_column("target", justify="right", no_wrap=True)
    table.add_column("met", justify="center", no_wrap=True)
    table.add_column("note", overflow="fold", ratio=1, min_width=MIN_NOTE)
    for m in measurements:
        target = ""
        if m.target is not None:
            sign = ">=" if m.direction is Direction.HIGHER_IS_BETTER else "<="
            target = f"{sign} {format_number(m.target)}"
        met = {True: "[green]✓[/]", False: "[red]✗[/]", None: ""}[m.met]
        table.add_row(m.bench, m.metric, format_number(m.value), m.unit, target, met, m.note)
    return table


def format_number(value: float) -> str:
    """Thousands separators for large figures, three significant digits for small ones."""
    if value != value:  # NaN: a figure that was skipped (its note says why)
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
