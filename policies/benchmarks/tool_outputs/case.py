"""One benchmark case: a tool call, the tool's output, and the facts planted in it.

A fact is kept by a reduction when every one of its needles appears verbatim in the
reduced text. Needles are atomic values (ids, names, numbers, ``file:line`` locations,
error codes, a short phrase of a message) that any faithful reduction keeps as printed;
all of a fact's needles appear together only at the fact's place in ``Case.text``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["REASONS", "Case", "Fact"]

REASONS = ("asked", "standout")


@dataclass(frozen=True, slots=True)
class Fact:
    """What a reader of the output needs: asked for by the call, or standing out (an error)."""

    needles: tuple[str, ...]  # every one must appear verbatim for the fact to count as kept
    reason: str  # "asked" or "standout"
    description: str  # one line, for humans


@dataclass(frozen=True, slots=True)
class Case:
    """A tool call as an agent makes it, and what the tool printed."""

    kind: str  # one of KINDS
    format: str  # "pytest", "tsc", "csv", "psql", ...
    tool_name: str  # "run_tests", "http_get", "sql_query", "read_file", "shell", ...
    arguments: dict[str, Any]  # JSON-able, as the agent sent them
    question: str  # the agent's last user or assistant turn before the call
    text: str  # the tool's output
    facts: tuple[Fact, ...]  # 1 to 3
