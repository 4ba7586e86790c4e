"""Deterministic, model-free reduction of a tool output to a token budget.

``ExtractiveSummarizer`` keeps whole lines of the output, chosen by priority when space
is short: error, warning and traceback lines (with a few lines of context) first, then
lines that mention identifiers from the tool call's arguments, then the tail, the head,
and the rest from both ends inwards. Runs of near-identical lines (equal once digits are
stripped) collapse into their first line and a count; long JSON arrays keep their first
items. Every elision is marked in the text with the lines and tokens it removed, and the
result never exceeds the budget by the counter's exact count.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from governor import ConfigError, TokenCounter, ToolOutputReduction

__all__ = ["ExtractiveSummarizer"]

_ERROR = re.compile(
    r"(?i)\b(error|errors|warning|warnings|warn|traceback|exception|failed|failure|fatal|panic)\b"
    r"|^E\s"  # pytest's assertion-explanation lines
    r"|\w+(Error|Exception):"
)
_TRACEBACK_START = re.compile(r"^\s*Traceback \(most recent call last\)")
_IDENTIFIER = re.compile(r"[A-Za-z_][\w.\-/]*\w")
_DIGITS = re.compile(r"\d+")
_MIN_RUN = 3  # a run of near-identical lines shorter than this is left alone
_CONTEXT_LINES = 5  # indented lines after an error line kept with it
_TRACEBACK_LINES = 40  # a traceback's body kept with its header, at most
_BAND = 10  # lines at each end that count as head and tail
_JSON_KEEP = (20, 10, 5, 3, 1)  # items kept per long array, tried in turn
_MIN_IDENTIFIER = 4  # shorter plain words in arguments match too many lines


@dataclass(frozen=True, slots=True)
class _Unit:
    """One kept-or-elided piece: a line, or a collapsed run of similar lines."""

    text: str
    num_lines: int
    tokens: int  # the original lines' own counts, summed
    cost: int  # tokens of ``text`` plus its newline
    rank: tuple[int, int, int]  # lower is kept first


class ExtractiveSummarizer:
    """A ``ToolOutputPolicy`` that keeps the lines that matter and marks what it drops."""

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self._counter = counter if counter is not None else TokenCounter()

    def __repr__(self) -> str:
        return f"ExtractiveSummarizer(counter={self._counter!r})"

    def reduce(
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> ToolOutputReduction:
        if (
            isinstance(budget_tokens, bool)
            or not isinstance(budget_tokens, int)
            or budget_tokens < 1
        ):
            raise ConfigError.below_minimum("budget_tokens", budget_tokens, 1)
        started = time.perf_counter()
        count = self._counter.count
        before = count(text)
        elided: dict[str, int] = {}
        method = "none"
        reduced = text
        if before > budget_tokens:
            method, reduced = self._reduce(text, budget_tokens, arguments or {}, elided)
        after = count(reduced)
        assert after <= budget_tokens or method == "none"
        return ToolOutputReduction(
            text=reduced,
            tokens_before=before,
            tokens_after=after,
            method=method,
            elapsed_s=time.perf_counter() - started,
            elided=tuple((what, n) for what, n in elided.items() if n),
        )

    def _reduce(
        self, text: str, budget: int, arguments: Mapping[str, Any], elided: dict[str, int]
    ) -> tuple[str, str]:
        source = text
        collapsed = _parse_json(text)
        if collapsed is not None:
            for keep in _JSON_KEEP:
                items: list[int] = [0]
                shown = json.dumps(_collapse(collapsed, keep, items), indent=2, ensure_ascii=False)
                if self._counter.count(shown) <= budget:
                    elided["json items"] = items[0]
                    return "json", shown
            elided["json items"] = items[0]
            source = shown
        kept = self._extract(source, budget, _identifiers(arguments), elided)
        if kept is not None:
            return "extractive", kept
        elided.clear()
        return "truncate", self._truncate(text, budget, elided)

    def _truncate(self, text: str, budget: int, elided: dict[str, int]) -> str:
        """The longest prefix that fits with a marker for the rest, or without one."""
        count, truncate = self._counter.count, self._counter.truncate
        room = budget - count(_marker(text.count("\n") + 1, count(text))) - 1
        prefix = truncate(text, room) if room > 0 else ""
        rest = text[len(prefix) :]
        marked = f"{prefix}\n{_marker(rest.count(chr(10)) + 1, count(rest))}"
        if not prefix or count(marked) > budget:
            prefix = marked = truncate(text, budget)
        elided["characters"] = len(text) - len(prefix)
        return marked

    def _extract(
        self, text: str, budget: int, identifiers: re.Pattern[str] | None, elided: dict[str, int]
    ) -> str | None:
        units = self._units(text.split("\n"), identifiers)
        marker = max(self._counter.count(_marker(u.num_lines * 10, u.tokens * 10)) for u in units)
        selected = [False] * len(units)
        order = sorted(range(len(units)), key=lambda i: units[i].rank)
        # Greedy by rank on estimates: each unit costs its tokens plus a newline, and
        # every maximal run of dropped units costs one marker.
        estimate = marker
        for i in order:
            left_open = i > 0 and not selected[i - 1]
            right_open = i < len(units) - 1 and not selected[i + 1]
            gaps = 1 if left_open and right_open else -1 if not (left_open or right_open) else 0
            cost = units[i].cost + gaps * marker
            if estimate + cost <= budget:
                selected[i] = True
                estimate += cost
        kept = [i for i in order if selected[i]]
        while True:
            rendered, dropped = _render(units, selected)
            over = self._counter.count(rendered) - budget
            if over <= 0:
                if not any(selected):
                    return None  # only markers: a plain prefix says more
                elided["similar lines"] = sum(
                    u.num_lines - 1 for u, s in zip(units, selected, strict=True) if s
                )
                elided["lines"] = dropped
                return rendered
            if not kept:
                return None
            freed = 0
            while kept and freed < over:  # drop the lowest-ranked kept units first
                i = kept.pop()
                selected[i] = False
                freed += units[i].cost

    def _units(self, lines: list[str], identifiers: re.Pattern[str] | None) -> list[_Unit]:
        count = self._counter.count
        error, context = _error_lines(lines)
        mentions = [
            identifiers is not None and identifiers.search(line) is not None for line in lines
        ]
        spans: list[tuple[int, int, int]] = []  # (first line, end, kind)
        start = 0
        while start < len(lines):
            kind = 0 if start in error else 1 if start in context else 2 if mentions[start] else 3
            end = start + 1
            if kind == 3:
                key = _key(lines[start])
                while end < len(lines) and not (end in error or end in context or mentions[end]):
                    if _key(lines[end]) != key:
                        break
                    end += 1
                if end - start < _MIN_RUN:
                    end = start + 1
            spans.append((start, end, kind))
            start = end
        n = len(spans)
        units = []
        for position, (first, end, kind) in enumerate(spans):
            tokens = sum(count(line) for line in lines[first:end])
            body = lines[first]
            if end - first > 1:
                rest = tokens - count(body)
                body += "\n" + _marker(end - first - 1, rest, similar=True)
            rank = _rank(kind, position, n)
            cost = tokens + 1 if end - first == 1 else count(body) + 1
            units.append(_Unit(body, end - first, tokens, cost, rank))
        return units


def _key(line: str) -> str:
    """What near-identical lines share: the line without digits or runs of spaces."""
    return " ".join(_DIGITS.sub("", line).split())


def _rank(kind: int, position: int, n: int) -> tuple[int, int, int]:
    from_end = n - 1 - position
    if kind == 0:
        return (0, 0, from_end)  # the last error is the most telling
    if kind == 1:
        return (0, 1, from_end)
    if kind == 2:
        return (1, 0, position)
    if from_end < _BAND:
        return (2, 0, from_end)
    if position < _BAND:
        return (3, 0, position)
    return (4, min(position, from_end), position)


def _error_lines(lines: list[str]) -> tuple[set[int], set[int]]:
    """Indexes of error lines, and of the traceback and context lines that go with them."""
    error = {i for i, line in enumerate(lines) if _ERROR.search(line)}
    context: set[int] = set()
    for i in sorted(error):
        limit = _TRACEBACK_LINES if _TRACEBACK_START.match(lines[i]) else _CONTEXT_LINES
        for j in range(i + 1, min(len(lines), i + 1 + limit)):
            if j in error:
                break
            context.add(j)
            if not lines[j][:1].isspace():  # the exception line ends a traceback
                break
    return error, context - error


def _render(units: list[_Unit], selected: list[bool]) -> tuple[str, int]:
    out: list[str] = []
    gap_lines = gap_tokens = dropped = 0
    for unit, keep in zip(units, selected, strict=True):
        if keep:
            if gap_lines:
                out.append(_marker(gap_lines, gap_tokens))
                gap_lines = gap_tokens = 0
            out.append(unit.text)
        else:
            gap_lines += unit.num_lines
            gap_tokens += unit.tokens
            dropped += unit.num_lines
    if gap_lines:
        out.append(_marker(gap_lines, gap_tokens))
    return "\n".join(out), dropped


def _marker(num_lines: int, tokens: int, *, similar: bool = False) -> str:
    what = "similar lines" if similar else "line" if num_lines == 1 else "lines"
    return f"[... {num_lines:,} {what} ({tokens:,} tokens) elided ...]"


def _identifiers(arguments: Mapping[str, Any]) -> re.Pattern[str] | None:
    found: set[str] = set()
    for value in _strings(arguments):
        value = value.strip()
        if _MIN_IDENTIFIER <= len(value) <= 200:
            found.add(value)
        for token in _IDENTIFIER.findall(value):
            if len(token) >= _MIN_IDENTIFIER or any(c in token for c in "_./"):
                found.add(token)
                found.update(part for part in token.split("/") if len(part) >= _MIN_IDENTIFIER)
    if not found:
        return None
    # Longest first, so the alternation prefers the most specific match.
    return re.compile("|".join(re.escape(s) for s in sorted(found, key=lambda s: (-len(s), s))))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _parse_json(text: str) -> Any | None:
    if text.lstrip()[:1] not in ("[", "{"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _collapse(value: Any, keep: int, items: list[int]) -> Any:
    """``value`` with every array longer than ``keep`` cut to ``keep`` items and a note."""
    if isinstance(value, dict):
        return {k: _collapse(v, keep, items) for k, v in value.items()}
    if isinstance(value, list):
        head = [_collapse(v, keep, items) for v in value[:keep]]
        if len(value) > keep:
            items[0] += len(value) - keep
            head.append(f"[... {len(value) - keep:,} more items elided ...]")
        return head
    return value
