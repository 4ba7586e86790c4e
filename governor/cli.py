"""The ``kvgov`` command line, the composition root: the one module of governor/
that may import every layer.

    kvgov --version
    kvgov bench NAME [--json] [--quick]

A benchmark is a module with ``run(*, quick: bool = False) -> Iterator[Measurement]``.
``BENCHMARKS`` maps each name that ``kvgov bench`` accepts to that module's import
path; the module is imported only when its benchmark runs, so ``kvgov --version``
stays cheap.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from governor import __version__

if TYPE_CHECKING:
    from engine.benchmarks import Measurement

__all__ = ["BENCHMARKS", "app"]

BENCHMARKS: Mapping[str, str] = MappingProxyType(
    {
        "allocator": "engine.benchmarks.allocator",
        "attention": "engine.benchmarks.attention",
        "engine": "engine.benchmarks.engine",
        "governor": "governor.benchmarks.governor",
        "policies": "policies.benchmarks.policies",
    }
)

app = typer.Typer(
    name="kvgov",
    help="A memory governor for LLM agent swarms, with a bundled paged-KV engine.",
    add_completion=False,
    no_args_is_help=True,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kvgov {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """A memory governor for LLM agent swarms, with a bundled paged-KV engine."""


@app.command()
def bench(
    name: Annotated[
        str, typer.Argument(help=f"Which benchmark: {', '.join(BENCHMARKS)}.", show_default=False)
    ],
    json_lines: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per measurement, nothing else.")
    ] = False,
    quick: Annotated[
        bool, typer.Option("--quick", help="Smaller sizes and fewer repeats, for smoke tests.")
    ] = False,
) -> None:
    """Run a benchmark and report each figure against its target."""
    if name != "all" and name not in BENCHMARKS:
        choices = ", ".join([*BENCHMARKS, "all"])
        typer.echo(f"Error: unknown benchmark {name!r}; choose one of: {choices}.", err=True)
        raise typer.Exit(code=2)
    names = list(BENCHMARKS) if name == "all" else [name]
    measurements = (
        _as_measurement(item)
        for each in names
        for item in importlib.import_module(BENCHMARKS[each]).run(quick=quick)
    )
    if json_lines:
        for measurement in measurements:
            typer.echo(json.dumps(measurement.to_json()))
    else:
        Console().print(_table(measurements))


def _as_measurement(item: Measurement | Mapping[str, Any]) -> Measurement:
    """Engine benchmarks yield ``Measurement``; the governor's and the policies', which may
    not import the engine, yield mappings with the same fields."""
    from engine.benchmarks import Direction, Measurement

    if isinstance(item, Measurement):
        return item
    fields = dict(item)
    fields["direction"] = Direction(fields.get("direction", "higher"))
    return Measurement(**fields)


def _table(measurements: Iterable[Measurement]) -> Table:
    from engine.benchmarks import Direction

    # Figures never wrap or get cut; names fold and notes wrap to fit narrow terminals.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("bench", overflow="fold")
    table.add_column("metric", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("unit", no_wrap=True)
    table.add_column("target", justify="right", no_wrap=True)
    table.add_column("met", justify="center", no_wrap=True)
    table.add_column("note", overflow="fold", ratio=1)
    for m in measurements:
        target = ""
        if m.target is not None:
            sign = ">=" if m.direction is Direction.HIGHER_IS_BETTER else "<="
            target = f"{sign} {_format_number(m.target)}"
        met = {True: "[green]✓[/]", False: "[red]✗[/]", None: ""}[m.met]
        table.add_row(m.bench, m.metric, _format_number(m.value), m.unit, target, met, m.note)
    return table


def _format_number(value: float) -> str:
    """Thousands separators for large figures, three significant digits for small ones."""
    if value != value:  # NaN: a figure that was skipped (its note says why)
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
