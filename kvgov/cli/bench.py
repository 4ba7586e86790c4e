"""``kvgov bench NAME``: run a benchmark (or ``all``) and print each figure against its
target, as a table or as JSON lines, with the host's load beside it.

The registry is read as ``kvgov.cli.benchmarks.BENCHMARKS`` when the command runs, so
whoever replaces that name (a test with fake benchmarks) is heard; the help lists the
real one.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from kvgov.cli import benchmarks
from kvgov.cli.benchmarks import BENCHMARKS, benchmark_runs, measurements, taking
from kvgov.cli.output import fail, host_figures, measurement_table
from kvgov.tables import print_table

__all__ = ["bench"]


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
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            help="Where the engine's benchmarks run (cpu, cuda, cuda:N); default: their own.",
            show_default=False,
        ),
    ] = None,
    plot: Annotated[
        str | None,
        typer.Option(
            "--plot",
            help="Write the benchmark's figures (SVG and PNG) to this folder, where it has any.",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="The engine's model where a benchmark takes one (swarm): a preset such as "
            "llama-8b-random, or a local model folder; default: tiny-random.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a benchmark and report each figure against its target."""
    registry = benchmarks.BENCHMARKS
    if name != "all" and name not in registry:
        choices = ", ".join([*registry, "all"])
        typer.echo(f"Error: unknown benchmark {name!r}; choose one of: {choices}.", err=True)
        raise typer.Exit(code=2)
    runs = benchmark_runs(registry, name)
    options: dict[str, Any] = {"quick": quick}
    if device is not None:
        from engine.device import resolve_device
        from engine.errors import InvalidRequestError

        try:
            options["device"] = str(resolve_device(device))
        except InvalidRequestError as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(code=2) from exc
        runs = taking("device", runs, name, "it runs on the host")
    if model is not None:
        from kvgov.twin import TwinFitError, model_label

        try:
            model_label(model)  # a preset or a folder, before anything runs
        except TwinFitError as exc:
            fail(str(exc))
        options["model"] = model
        runs = taking("model", runs, name, "it runs its own model")
    figures = measurements(runs, options, plot)
    if json_lines:
        for measurement in figures:
            typer.echo(json.dumps({**measurement.to_json(), **host_figures()}))
    else:
        console, start = Console(), host_figures()
        print_table(console, measurement_table(figures))
        end = host_figures()
        console.print(
            f"[dim]host: {end['cpus']} CPUs, 1-minute load average {start['load_1m']:.2f} at "
            f"the start, {end['load_1m']:.2f} at the end (ratios measured side by side hold "
            "best near a load of 1; far above it, other processes take the cores)[/]"
        )
