"""``report_main``: ``kvgov report PATH...`` printed, or a one-line error and exit code 2."""

from __future__ import annotations

import os
import sys

from integrations.report._render import render
from integrations.report.run_report import RunReport

__all__ = ["report_main"]


def report_main(path: str | os.PathLike[str], *more: str | os.PathLike[str]) -> int:
    """``kvgov report PATH...``: print the report of the run recorded there (several
    files: one run of several processes, merged); 0, or 2 with one line on stderr when a
    file is missing or is not a recorded run."""
    try:
        report = RunReport.from_jsonl(path, *more)
    except OSError as exc:
        where = exc.filename if exc.filename is not None else path
        print(
            f"kvgov report: cannot read {os.fspath(where)}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    except ValueError as exc:  # SpanFileError, ReportError, a file that is not UTF-8
        message = " ".join(str(exc).split())
        print(f"kvgov report: {message}", file=sys.stderr)
        return 2
    from rich.console import Console

    Console().print(render(report))
    return 0
