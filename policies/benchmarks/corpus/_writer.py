"""Where a generator writes: lines, with the indexes of the error lines among them.

A line is labelled an error as it is written, never afterwards; blank lines never are.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Call", "Generator", "Writer"]


@dataclass(slots=True)
class Writer:
    """One document's lines as they are written, and which of them are errors."""

    lines: list[str] = field(default_factory=list)
    errors: list[int] = field(default_factory=list)
    chars: int = 0

    def add(self, text: str = "", *, error: bool = False) -> None:
        """One line, or several separated by newlines, all labelled alike."""
        for line in text.split("\n"):
            if error and line.strip():
                self.errors.append(len(self.lines))
            self.lines.append(line)
            self.chars += len(line) + 1

    def add_marked(self, template: str, **fields: object) -> None:
        """Lines of the filled ``template``; those starting with "!" are error lines."""
        for line in template.format(**fields).split("\n"):
            self.add(line.removeprefix("!"), error=line.startswith("!"))


Call = tuple[str, str, dict[str, str]]  # flavour, tool name, arguments
Generator = Callable[[random.Random, Writer, int, int], Call]  # rng, out, tokens, variant
