"""``kvgov map``: the memory map of a plan (``kvgov plan``'s options) or of a run's memory
record, drawn as SVG and PNG (``kvgov.memory_map``)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvgov.cli.calculator import plan_from_options
from kvgov.cli.output import fail

__all__ = ["memory_map"]


def memory_map(
    preset: Annotated[str | None, typer.Option(help="As for kvgov plan.")] = None,
    config: Annotated[str | None, typer.Option(help="As for kvgov plan.")] = None,
    card_gb: Annotated[float, typer.Option(help="The card's memory, GB.")] = 16.0,
    weights_gb: Annotated[float, typer.Option(help="Memory the weights take, GB.")] = 5.5,
    overhead_gb: Annotated[float, typer.Option(help="Runtime overhead, GB.")] = 0.5,
    kv_dtype: Annotated[str | None, typer.Option(help="KV cache dtype.")] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    ceiling: Annotated[int, typer.Option(help="Each agent's ceiling, tokens.")] = 16_000,
    agents: Annotated[int, typer.Option(help="How many agents run at once.")] = 8,
    average: Annotated[int, typer.Option(help="Their average context, tokens.")] = 3_000,
    record: Annotated[
        str | None,
        typer.Option(help="A memory record a run wrote (kvgov demo does), instead of a plan."),
    ] = None,
    out: Annotated[str, typer.Option(help="Where to write PATH.svg and PATH.png.")] = "kvgov-map",
) -> None:
    """Draw the memory map: contiguous reserve-for-max against paged, as SVG and PNG."""
    from governor.errors import GovernorError
    from kvgov.memory_map import MemoryMap

    if record is not None:
        try:
            memory = MemoryMap.load(record)
        except GovernorError as exc:
            fail(str(exc))
    else:
        plan = plan_from_options(
            preset=preset or (None if config else "qwen3.5-9b"),
            config=config,
            card_gb=card_gb,
            weights_gb=weights_gb,
            overhead_gb=overhead_gb,
            kv_dtype=kv_dtype,
            block_size=block_size,
            ceiling=ceiling,
            cap=None,
            agents=agents,
            average=average,
            safety=0.9,
        )
        memory = MemoryMap.from_plan(plan)
    try:
        svg, png = memory.render(out)
    except OSError as exc:
        fail(f"cannot write the map to {out}: {exc}")
    typer.echo(memory.caption())
    typer.echo(f"wrote {svg} and {png}")
