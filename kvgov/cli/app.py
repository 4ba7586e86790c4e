"""The ``kvgov`` Typer application: ``--version`` and one command per module of
``kvgov.cli``, listed in ``kvgov --help`` in the order they are added here.

Each command imports what it runs (the engine, FastAPI, matplotlib) only when it runs,
so ``kvgov --version`` and ``kvgov --help`` stay cheap.
"""

from __future__ import annotations

from typing import Annotated

import typer

from governor import __version__
from kvgov.cli.bench import bench
from kvgov.cli.demo import demo
from kvgov.cli.map import memory_map
from kvgov.cli.plan import plan
from kvgov.cli.report import report
from kvgov.cli.serve import serve
from kvgov.cli.twin import twin

__all__ = ["app"]

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


app.command()(serve)
app.add_typer(twin, name="twin")
app.command()(demo)
app.command()(bench)
app.command()(plan)
app.command("map")(memory_map)
app.command()(report)
