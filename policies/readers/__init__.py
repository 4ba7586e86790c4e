"""Readers of tool-output structure: what to keep of a JSON body, a table, a diff, a log.

Each reader recognises one kind of structure by content and splits the text into ranked
``Piece``s (``pieces.py``); ``fit`` keeps them in rank order under a token budget and marks
what it leaves out; ``gist`` keeps the first-ranked ones alone, for a summary of many
outputs. ``READERS`` is the order ``ExtractiveSummarizer`` tries them in: the
most specific structure first, so that a test run holding tracebacks is read as
diagnostics, and a log holding a traceback as a trace. ``read_lines`` reads anything,
line by line.
"""

from __future__ import annotations

from collections.abc import Callable

from policies.readers.diagnostics import read_diagnostics
from policies.readers.diff import read_diff
from policies.readers.fit import Fitted, fit, gist
from policies.readers.lines import read_lines
from policies.readers.listing import read_listing
from policies.readers.logs import read_log
from policies.readers.pieces import Piece, Query, Reading, Tier
from policies.readers.prose import read_prose
from policies.readers.records import read_json
from policies.readers.tables import read_table
from policies.readers.traces import read_traces

__all__ = [
    "READERS",
    "Fitted",
    "Piece",
    "Query",
    "Reader",
    "Reading",
    "Tier",
    "fit",
    "gist",
    "read_diagnostics",
    "read_diff",
    "read_json",
    "read_lines",
    "read_listing",
    "read_log",
    "read_prose",
    "read_table",
    "read_traces",
]

Reader = Callable[[str, Query], Reading | None]

READERS: tuple[Reader, ...] = (
    read_json,
    read_diff,
    read_diagnostics,
    read_traces,
    read_table,
    read_log,
    read_listing,
    read_prose,
)
