"""``kvgov demo``: the demo's three runs on one KV budget, their table, traces and memory
map, then (unless ``--no-twin``) the second act on the hardware twin (``kvgov.demo``)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from kvgov.cli.output import fail
from kvgov.tables import print_table

__all__ = ["demo"]


def demo(
    agents: Annotated[int, typer.Option(help="Worker agents the planner fans out to.")] = 8,
    ceiling: Annotated[int, typer.Option(help="Each worker's ceiling, tokens.")] = 4_096,
    kv_budget: Annotated[
        str, typer.Option(help="KV cache for each of the three runs: 48MiB, 50MB, 1.5GiB.")
    ] = "48MiB",
    turns: Annotated[int, typer.Option(help="Tool-calling turns per worker.")] = 4,
    model: Annotated[
        str, typer.Option(help="tiny-random, or a local Hugging Face checkpoint folder.")
    ] = "tiny-random",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    max_fanout: Annotated[
        int | None, typer.Option(help="kvgov's cap on workers at once (default: all).")
    ] = None,
    out: Annotated[str, typer.Option(help="Folder for the traces and the memory map.")] = (
        "kvgov-demo"
    ),
    show_twin: Annotated[
        bool,
        typer.Option(
            "--twin/--no-twin",
            help="Then show the swarm at the reference user's scale on the hardware twin "
            "(modelled, about 15 s more).",
        ),
    ] = True,
) -> None:
    """A planner and its workers, run three ways on one KV budget: reserve-for-max, the paged
    engine alone, then kvgov."""
    from pathlib import Path

    from kvgov.cli.extras import missing_for

    if (missing := missing_for("engine")) is not None:
        fail(missing)

    from governor.errors import GovernorError
    from kvgov.demo import DemoOptions, parse_size, result_table, run_demo

    console = Console()
    try:
        options = DemoOptions(
            agents=agents,
            ceiling=ceiling,
            kv_budget_bytes=parse_size(kv_budget),
            turns=turns,
            model=model,
            device=device,
            max_fanout=max_fanout,
            out=Path(out),
        )
        result = run_demo(options, console=console)
    except GovernorError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write to {out}: {exc}")
    print_table(console, result_table(result))
    for scheme, trace in result.traces.items():
        console.print(f"trace ({scheme}): {trace}   [dim]kvgov report {trace}[/]")
    if result.memory_map is not None:
        svg, png = result.memory_map
        console.print(f"memory map: {svg} and {png}")
        console.print(f"[dim]{result.memory_caption}[/]")
    if show_twin:
        from kvgov.demo.twin import second_act

        second_act(console)
