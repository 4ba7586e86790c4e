"""``kvgov twin``: the hardware twin's commands. ``fit`` fits a device profile to a
measured step-time grid; ``check`` replays the swarm workload on the twin calibrated here
and on the real engine, side by side."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from kvgov.cli.output import fail, host_figures, measurement_table
from kvgov.tables import print_table

__all__ = ["twin"]

twin = typer.Typer(
    help="The hardware twin: a model of how long engine steps take on a device.",
    no_args_is_help=True,
)


@twin.command("fit")
def twin_fit(
    device: Annotated[
        str | None,
        typer.Option(
            help="Where to measure: cpu, cuda or cuda:N [default: cpu].", show_default=False
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="A preset such as llama-8b-random, or a local model folder [default: "
            "tiny-random, or the grid's model].",
            show_default=False,
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help="The device profile to fit: a name (cpu-here, h100-sxm, ...) or a profile "
            "file [default: cpu-here on cpu, or the grid's].",
            show_default=False,
        ),
    ] = None,
    grid: Annotated[
        str | None,
        typer.Option(help="Fit a recorded grid (a GPU run's) instead of measuring one."),
    ] = None,
    save_grid: Annotated[
        str | None, typer.Option(help="Write the measured grid here, for later refits.")
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(
            help="Write the fitted profile here [default: $XDG_CACHE_HOME/kvgov/twin/NAME.json].",
            show_default=False,
        ),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="A smaller grid and fewer repeats (about 30 s on 2 cores)."),
    ] = False,
    json_lines: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per figure, nothing else.")
    ] = False,
    held_back: Annotated[
        float, typer.Option(help="The fraction of the points held back from the fit, in (0, 1).")
    ] = 0.25,
    seed: Annotated[int, typer.Option(help="Picks the held-back points and the prompts.")] = 0,
) -> None:
    """Fit a device profile's step-time factors to a measured grid; report the error on
    the points held back from the fit."""
    from pathlib import Path

    from kvgov.cli.extras import missing_for

    if (missing := missing_for("engine")) is not None:
        fail(missing)

    from engine.errors import EngineError
    from engine.twin.grid import GridError
    from kvgov.twin import FitOptions, TwinFitError, factor_table, fit_twin

    try:
        result = fit_twin(
            FitOptions(
                device=device,
                model=model,
                profile=profile,
                grid=None if grid is None else Path(grid),
                save_grid=None if save_grid is None else Path(save_grid),
                out=None if out is None else Path(out),
                quick=quick,
                held_back=held_back,
                seed=seed,
            )
        )
    except (EngineError, GridError, TwinFitError) as exc:
        fail(str(exc))
    if json_lines:
        for measurement in result.measurements():
            typer.echo(json.dumps({**measurement.to_json(), **host_figures()}))
        return
    console = Console()
    print_table(console, measurement_table(result.measurements()))
    print_table(console, factor_table(result))
    console.print(f"profile written to {result.out}")


@twin.command("check")
def twin_check(
    quick: Annotated[
        bool,
        typer.Option("--quick", help="The swarm benchmark's quick workload and a quick grid."),
    ] = False,
    rounds: Annotated[
        int,
        typer.Option(
            help="Real rounds per policy (the twin runs four times as many); medians compared."
        ),
    ] = 5,
    fraction: Annotated[
        float, typer.Option(help="The KV budget, as a share of every agent's peak at once.")
    ] = 0.33,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            help="A policy to check (repeat for more) [default: all four].", show_default=False
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help="A fitted cpu-here profile file [default: calibrate now].", show_default=False
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="The workload's seed.")] = 0,
    json_lines: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per figure, nothing else.")
    ] = False,
) -> None:
    """Replay the swarm workload on the twin calibrated to this machine and on the real
    engine, side by side; report the twin's error on every policy's figures."""
    import sys
    from pathlib import Path

    from kvgov.cli.extras import missing_for

    if (missing := missing_for("engine")) is not None:
        fail(missing)

    from engine.errors import EngineError
    from kvgov.twin_check import CheckOptions, TwinCheckError, check_twin

    options = CheckOptions(
        quick=quick,
        rounds=rounds,
        fraction=fraction,
        seed=seed,
        profile=None if profile is None else Path(profile),
        **({} if not policy else {"policies": tuple(policy)}),
    )
    try:
        result = check_twin(
            options, progress=lambda line: print(f"[twin check] {line}", file=sys.stderr)
        )
    except (EngineError, TwinCheckError) as exc:
        fail(str(exc))
    measurements = list(result.measurements())
    if json_lines:
        for measurement in measurements:
            typer.echo(json.dumps({**measurement.to_json(), **host_figures()}))
        return
    print_table(Console(), measurement_table(measurements))
