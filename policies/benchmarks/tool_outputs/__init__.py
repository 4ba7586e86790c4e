"""A seeded corpus of tool calls and their outputs, with the facts a reduction must keep.

``build_cases(seed)`` returns ``per_kind`` cases of every kind in ``KINDS``: an agent's
tool call (name, arguments, the turn before it) and the tool's output, 1,500-20,000
tokens, as the real tool prints it (JSON APIs, JSON lines, CSV, aligned tables, diffs,
test runs, builds, logs, stack traces, listings, search results, HTML, prose). Each case
plants one to three facts: what the call asked for, or what stands out (an error, a
failure, an outlier). The format, sizes, placement and phrasing of everything come from
the seed; the same seed always gives the same cases.

Tune on ``TUNING_SEED`` only; report on ``EVALUATION_SEEDS``. The corpus was written
without reading any reducer, so that no fact follows a reducer's patterns.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from policies.benchmarks.tool_outputs import (
    builds,
    csv_exports,
    diffs,
    json_api,
    jsonl,
    listings,
    logs,
    prose,
    search,
    stack_traces,
    tables,
    testing,
    web_pages,
)
from policies.benchmarks.tool_outputs.case import REASONS, Case, Fact

__all__ = [
    "EVALUATION_SEEDS",
    "FORMATS",
    "KINDS",
    "REASONS",
    "TUNING_SEED",
    "Case",
    "Fact",
    "build_cases",
]

_MODULES = {
    "json": json_api,
    "jsonl": jsonl,
    "csv": csv_exports,
    "table": tables,
    "diff": diffs,
    "test_output": testing,
    "build_output": builds,
    "log": logs,
    "stack_trace": stack_traces,
    "listing": listings,
    "search": search,
    "html": web_pages,
    "prose": prose,
}
KINDS: tuple[str, ...] = tuple(_MODULES)
FORMATS: dict[str, tuple[str, ...]] = {kind: module.FORMATS for kind, module in _MODULES.items()}
_BUILD: dict[str, Callable[[random.Random], Case]] = {
    kind: module.build for kind, module in _MODULES.items()
}

TUNING_SEED = 0
EVALUATION_SEEDS = tuple(range(1, 11))


def build_cases(seed: int, *, per_kind: int = 2) -> list[Case]:
    """``per_kind`` cases of each kind, kinds in ``KINDS`` order; deterministic in ``seed``."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if isinstance(per_kind, bool) or not isinstance(per_kind, int) or per_kind < 1:
        raise ValueError(f"per_kind must be an int of at least 1, got {per_kind!r}")
    return [
        _BUILD[kind](random.Random(f"kvgov-tool-outputs:{seed}:{kind}:{index}"))
        for kind in KINDS
        for index in range(per_kind)
    ]
