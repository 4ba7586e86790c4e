"""``kvgov report RUN.jsonl...``: a run's trace read back (``integrations.report``); several
files (one per process of a run that shared a store) are read as one run."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["report"]


def report(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="A run's spans, as JSON lines (kvgov demo writes one); several files, one "
            "per process of one run, are merged."
        ),
    ],
) -> None:
    """Read a run back: per-agent context, peaks, waits, compactions, and what to change."""
    from integrations.report import report_main

    raise typer.Exit(report_main(*paths))
