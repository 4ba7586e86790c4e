"""``kvgov report RUN.jsonl``: a run's trace read back (``integrations.report``)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["report"]


def report(
    path: Annotated[
        str, typer.Argument(help="A run's spans, as JSON lines (kvgov demo writes one).")
    ],
) -> None:
    """Read a run back: per-agent context, peaks, waits, compactions, and what to change."""
    from integrations.report import report_main

    raise typer.Exit(report_main(path))
