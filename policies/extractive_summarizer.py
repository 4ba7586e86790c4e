"""Deterministic, model-free reduction of a tool output to a token budget.

``ExtractiveSummarizer`` reads the output's structure and keeps what the agent asked for
and what stands out, marking every elision with what it removed. The first reader that
recognises the text reads it (``policies.readers.READERS``: diagnostics, stack traces,
JSON, tables, diffs, logs, listings, prose); text none of them recognises is read line by
line (``read_lines``: lines naming the call's terms, errors and their context, the tail
and head, then the rest), and ``fit`` keeps a reading's pieces in rank order while they
fit. What the agent asked for is the call's arguments and, where the caller passes it,
the agent's last request (``question``). Output that not even one piece of fits is cut to
its longest prefix with a marker. The result never exceeds the budget by the counter's
exact count.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from governor import TokenCounter, ToolOutputReduction
from policies._conversation import check_setting
from policies.readers import READERS, Reader
from policies.readers.fit import fit, gist, marker
from policies.readers.lines import read_lines
from policies.readers.pieces import Query

__all__ = ["ExtractiveSummarizer"]


class ExtractiveSummarizer:
    """A ``ToolOutputPolicy`` that reads the output's structure, keeps what matters and
    marks what it drops. ``readers`` replaces the structure readers tried before the
    line-by-line one (``()``: lines only)."""

    def __init__(
        self, counter: TokenCounter | None = None, *, readers: Sequence[Reader] | None = None
    ) -> None:
        self._counter = counter if counter is not None else TokenCounter()
        self._readers = READERS if readers is None else tuple(readers)

    def __repr__(self) -> str:
        names = ", ".join(reader.__name__ for reader in self._readers)
        return f"ExtractiveSummarizer(counter={self._counter!r}, readers=({names}))"

    def reduce(
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        question: str | None = None,
    ) -> ToolOutputReduction:
        check_setting("budget_tokens", budget_tokens, 1)
        started = time.perf_counter()
        before = self._counter.count(text)
        elided: tuple[tuple[str, int], ...] = ()
        method, reduced, after = "none", text, before
        if before > budget_tokens:
            query = Query.of(tool_name, arguments, question)
            method, reduced, after, elided = self._reduce(text, budget_tokens, query)
        assert after <= budget_tokens or method == "none"
        return ToolOutputReduction(
            text=reduced,
            tokens_before=before,
            tokens_after=after,
            method=method,
            elapsed_s=time.perf_counter() - started,
            elided=tuple((what, n) for what, n in elided if n),
        )

    def gist(
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        question: str | None = None,
    ) -> str:
        """The output's most telling lines within ``budget_tokens``, for a summary of many
        outputs (``SummarizeOldest``): what ``reduce`` keeps first, most telling first,
        without the shape lines and elision markers that a reduction shows in place of
        the rest (so a shorter gist of it is its first lines); the text itself where it
        fits, its longest prefix where no piece of it does."""
        check_setting("budget_tokens", budget_tokens, 1)
        if self._counter.count(text) <= budget_tokens:
            return text
        query = Query.of(tool_name, arguments, question)
        for reader in self._readers:
            reading = reader(text, query)
            if reading is not None and (kept := gist(reading, budget_tokens, self._counter)):
                return kept
        kept = gist(read_lines(text, query, counter=self._counter), budget_tokens, self._counter)
        return kept if kept is not None else self._counter.truncate(text, budget_tokens)

    def _reduce(
        self, text: str, budget: int, query: Query
    ) -> tuple[str, str, int, tuple[tuple[str, int], ...]]:
        """``(method, text, exact tokens, elided)`` of the reduction."""
        for reader in self._readers:
            reading = reader(text, query)
            if reading is not None and (fitted := fit(reading, budget, self._counter)):
                return reading.method, fitted.text, fitted.tokens, fitted.elided
        fitted = fit(read_lines(text, query, counter=self._counter), budget, self._counter)
        if fitted is not None:
            return "extractive", fitted.text, fitted.tokens, fitted.elided
        truncated, cut = self._truncate(text, budget)
        return "truncate", truncated, self._counter.count(truncated), (("characters", cut),)

    def _truncate(self, text: str, budget: int) -> tuple[str, int]:
        """The longest prefix that fits with a marker for the rest, or without one, and how
        many characters it cut."""
        count, truncate = self._counter.count, self._counter.truncate
        room = budget - count(self._gap(text)) - 1
        prefix = truncate(text, room) if room > 0 else ""
        marked = f"{prefix}\n{self._gap(text[len(prefix) :])}"
        if not prefix or count(marked) > budget:
            prefix = marked = truncate(text, budget)
        return marked, len(text) - len(prefix)

    def _gap(self, text: str) -> str:
        return marker({"lines": text.count("\n") + 1}, self._counter.count(text))
