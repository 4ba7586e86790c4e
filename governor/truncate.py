"""``HeadTailTruncation``: the governor's default ``ToolOutputPolicy``.

The simplest reduction that still serves an agent: keep the head of the output (what the
tool printed first: headers, the command, the first results) and its tail (summaries,
exit codes, the final error), cut at line ends where it can, and put one visible marker
between them saying how many lines and tokens were removed. Exact: the result is
counted with the same ``TokenCounter`` and never exceeds the budget. For a reduction that
keeps error lines and what the call asked about, use ``policies.ExtractiveSummarizer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from governor.clock import SYSTEM_CLOCK, Clock
from governor.errors import ConfigError
from governor.tokens import TokenCounter
from governor.tool_output import ToolOutputReduction

__all__ = ["HeadTailTruncation"]


class HeadTailTruncation:
    """Keeps ``head_share`` of the budget from the start and the rest from the end;
    ``clock`` times each reduction (``ToolOutputReduction.elapsed_s``): the governor's."""

    def __init__(
        self,
        counter: TokenCounter | None = None,
        *,
        head_share: float = 0.5,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if (
            isinstance(head_share, bool)
            or not isinstance(head_share, (int, float))
            or not 0 <= head_share <= 1
        ):
            raise ConfigError(
                f"head_share must be a fraction in [0, 1], got {head_share!r}; 0.5 keeps as "
                "much of the start as of the end",
                setting="head_share",
            )
        self._counter = counter if counter is not None else TokenCounter()
        self._head_share = float(head_share)
        self._clock = clock

    def __repr__(self) -> str:
        return f"HeadTailTruncation(counter={self._counter!r}, head_share={self._head_share})"

    def reduce(
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        question: str | None = None,
    ) -> ToolOutputReduction:
        if (
            isinstance(budget_tokens, bool)
            or not isinstance(budget_tokens, int)
            or budget_tokens < 1
        ):
            raise ConfigError.below_minimum("budget_tokens", budget_tokens, 1)
        started = self._clock.now()
        count = self._counter.count
        before = count(text)
        if before <= budget_tokens:
            return ToolOutputReduction(text, before, before, "none", self._clock.now() - started)
        reduced, removed_lines = self._cut(text, before, budget_tokens)
        after = count(reduced)
        return ToolOutputReduction(
            reduced,
            before,
            after,
            "head_tail",
            self._clock.now() - started,
            elided=(("lines", removed_lines),) if removed_lines else (),
        )

    def _cut(self, text: str, before: int, budget: int) -> tuple[str, int]:
        count, truncate = self._counter.count, self._counter.truncate
        # The marker's size is bounded by the largest numbers it can show.
        widest = _marker(text.count("\n") + 1, before)
        room = budget - count(widest) - 2  # the two newlines around it
        if room < 1:
            return truncate(text, budget), 0
        head = truncate(text, round(room * self._head_share))
        if "\n" in head and len(head) < len(text):
            head = head[: head.rindex("\n") + 1]  # whole lines where there are any
        tail_room = room - count(head)
        tail = _suffix(text[len(head) :], tail_room, self._counter)
        middle = text[len(head) : len(text) - len(tail)]
        lines = middle.count("\n") + (0 if middle.endswith("\n") else 1)
        marker = _marker(lines, count(middle))
        reduced = f"{head.rstrip(chr(10))}\n{marker}\n{tail.lstrip(chr(10))}"
        while count(reduced) > budget and tail:  # BPE merges across the seams, rarely
            tail = tail[1:]
            reduced = f"{head.rstrip(chr(10))}\n{marker}\n{tail}"
        return reduced, lines


def _suffix(text: str, max_tokens: int, counter: TokenCounter) -> str:
    """The longest run of whole lines at the end of ``text`` within ``max_tokens``, or a
    character suffix when not even the last line fits."""
    if max_tokens < 1 or not text:
        return ""
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        cost = counter.count(line)
        if used + cost > max_tokens:
            break
        kept.append(line)
        used += cost
    if kept:
        suffix = "".join(reversed(kept))
        while suffix and counter.count(suffix) > max_tokens:  # merges at line joins
            suffix = suffix[suffix.find("\n") + 1 :] if "\n" in suffix[:-1] else ""
        return suffix
    # Not even the last line fits: the end of it, reversed-truncated by characters.
    last = lines[-1]
    lo, hi = 0, len(last)
    while lo < hi:  # the shortest start index whose suffix fits
        mid = (lo + hi) // 2
        if counter.count(last[mid:]) <= max_tokens:
            hi = mid
        else:
            lo = mid + 1
    return last[lo:]


def _marker(lines: int, tokens: int) -> str:
    return f"[... {lines:,} lines ({tokens:,} tokens) removed ...]"
