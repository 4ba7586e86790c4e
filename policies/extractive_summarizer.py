"""Deterministic, model-free reduction of a tool output to a token budget.

``ExtractiveSummarizer`` keeps whole lines of the output, chosen by priority when space
is short: (1) lines that report an error: an exception named, a traceback header, an
upper-case level or verdict (``ERROR``, ``--- FAIL:``, ``WARN``), an ``error:`` prefix, an
OS error (``Permission denied``), a count of failures; (2) their tracebacks and context:
stack frames anywhere, indented lines just after an error and just before it (``go test``
prints a failure's messages first); (3) lines that mention identifiers from the tool
call's arguments, counting only identifiers found on few lines; (4) the tail, then the
head; (5) lines that merely use an error word (``retries failed requests``); (6) the rest,
from both ends inwards. Runs of near-identical lines (equal once digits are stripped, every
number counting up or staying put, as in ``test_7 PASSED [ 3%]``) collapse into their first
line and a count; lines whose numbers jump about (latencies, ids) carry information and
are kept or dropped one by one. Long JSON arrays keep as many first items as fit, plus
the items that report an error. Every elision is marked in the text with the lines and
tokens it removed, room left once the exact count is known is filled, and the result never
exceeds the budget by the counter's exact count.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import IntEnum
from itertools import accumulate
from typing import Any

from governor import TokenCounter, ToolOutputReduction
from policies._conversation import check_setting

__all__ = ["ExtractiveSummarizer"]

# _FRAME runs over the whole text (MULTILINE): no pattern may match across a newline.
_ERROR = re.compile(
    r"^[ \t]*Traceback \(most recent call last\)"
    r"|^E[ \t]"  # pytest's assertion-explanation lines
    r"|\b[A-Z]\w*(?:Error|Exception|Warning)\b(?::|$)"  # an exception or warning named
    r"|\b(?:ERROR|FATAL|FAIL|FAILED|FAILURE|WARN|WARNING|CRITICAL|SEVERE|PANIC)\b"
    r"|(?i:\b(?:error|warning|fatal|panic)(?:\[[\w-]+\])?:)"  # compilers, runtimes, CLIs
    r"|(?i:permission denied|no such file or directory|connection refused|command not found)"
    r"|(?i:\b[1-9]\d* (?:failed|failures?|errors?)\b)"  # a verdict: "2 failed, 40 passed"
    r"|^[ \t]*(?:Caused by:|During handling of the above exception|Exception in thread)",
    re.MULTILINE,
)
_WORDS = "error|errors|warning|warnings|warn|traceback|exception|failed|failure|fatal|panic"
_ERROR_WORD = re.compile(rf"(?i)\b(?:{_WORDS})\b")
_FRAME = re.compile(
    r'^[ \t]*File "[^"\n]*", line \d+'  # Python
    r"|^[ \t]+at [^\s(]+\([^)\n]*\)[ \t]*$"  # Java, JavaScript
    r"|^[ \t]*\.\.\. \d+ more[ \t]*$"  # Java's elided common frames
    r"|^[\w./-]+\.\w+:\d+: in \w+",  # pytest's long tracebacks
    re.MULTILINE,
)
# Every match of _ERROR or _ERROR_WORD holds one of these once lowercased ("^E\s" a "\ne ").
_KEYWORDS = ("error", "exception", "warn", "fail", "fatal", "panic", "traceback", "critical",
             "severe", "denied", "refused", "not found", "no such file", "caused by",
             "during handling", "\ne ", "\ne\t")  # fmt: skip
_IDENTIFIER = re.compile(r"[A-Za-z_][\w.\-/]*\w")
_DIGITS = re.compile(r"\d+")
_DIGITS_OR_SPACES = re.compile(r"[\d\s]+")  # blanked, they leave what similar lines share
# JSON reporting an error: an error key with a value (not empty, null, false, 0), or a status.
_JSON_ERROR = re.compile(
    r'"(?i:error|errors|exception|failure|fault|traceback|stacktrace|stack_trace)"\s*:\s*'
    r'(?:"[^"]|\{\s*"|\[\s*[^\]\s]|true|-?[1-9])'
    r'|"(?i:status|state|phase|level|severity|result|outcome|reason|message|msg)"\s*:\s*'
    rf'"[^"\n]*\b(?i:{_WORDS})\b'
)
_MIN_RUN = 3  # a run of near-identical lines shorter than this is left alone
_CONTEXT_LINES = 5  # indented lines before and after an error line kept with it
_TRACEBACK_LINES = 40  # a traceback's body kept with its header, at most
_BAND = 10  # lines at each end that count as head and tail
_SELECTIVE = 10  # an identifier on over 1/10 of the lines (and over _BAND) picks out nothing
_JSON_KEEP = 20  # items kept per long array, tried first; then as many as fit
_MIN_IDENTIFIER = 4  # shorter plain words in arguments match too many lines
_REFILLS = 2  # passes that fill the room left once the exact count is known


class _Kind(IntEnum):
    ERROR = 0
    CONTEXT = 1
    MENTION = 2
    ERROR_WORD = 3
    AFTER_ERROR = 4  # ranked as plain, but never collapsed: it shows what came next
    PLAIN = 5


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
        check_setting("budget_tokens", budget_tokens, 1)
        started = time.perf_counter()
        before = self._counter.count(text)
        elided: dict[str, int] = {}
        method, reduced, after = "none", text, before
        if before > budget_tokens:
            method, reduced, after = self._reduce(text, budget_tokens, arguments or {}, elided)
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
    ) -> tuple[str, str, int]:
        """``(method, text, exact tokens)`` of the reduction."""
        source = text
        parsed = None
        if text.lstrip()[:1] in ("[", "{"):
            with contextlib.suppress(ValueError):
                parsed = json.loads(text)
        if parsed is not None:
            flags: dict[int, bool] | None = {} if _JSON_ERROR.search(text) else None
            shown, num_items, tokens = self._fit_json(parsed, budget, flags, of_errors=False)
            if tokens > budget and flags and any(flags.values()):  # as many errors as fit
                shown, num_items, tokens = self._fit_json(parsed, budget, flags, of_errors=True)
            elided["json items"] = num_items
            if tokens <= budget:
                return "json", shown, tokens
            source = shown
        kept = self._extract(source, budget, _identifiers(arguments), elided)
        if kept is not None:
            return "extractive", *kept
        elided.clear()
        truncated = self._truncate(text, budget, elided)
        return "truncate", truncated, self._counter.count(truncated)

    def _fit_json(
        self, value: Any, budget: int, flags: dict[int, bool] | None, *, of_errors: bool
    ) -> tuple[str, int, int]:
        """``(text, items elided, exact tokens)`` of the value with as many items per long
        array as fit, at least one: first items and every error item, or (``of_errors``)
        error items only. Over budget when even one is too many."""
        tried: dict[int, tuple[str, int, int]] = {}

        def attempt(n: int) -> tuple[str, int, int]:
            if n not in tried:
                items = [0]
                keep, cap = (1, n) if of_errors else (n, None)
                collapsed = _collapse(value, keep, items, flags, cap)
                shown = json.dumps(collapsed, indent=2, ensure_ascii=False)
                tried[n] = (shown, items[0], self._counter.count(shown))
            return tried[n]

        lo, hi = 0, _JSON_KEEP  # invariant: lo items fit (0: none tried), hi do not
        while attempt(hi)[2] <= budget:  # gallop up from the first guess
            if attempt(hi)[1] == 0 or (lo and attempt(hi)[0] == attempt(lo)[0]):
                return attempt(hi)  # nothing left to cut, or more items add nothing
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if attempt(mid)[2] <= budget:
                lo = mid
            else:
                hi = mid
        return attempt(max(lo, 1))

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
        self, text: str, budget: int, identifiers: tuple[str, ...], elided: dict[str, int]
    ) -> tuple[str, int] | None:
        """The kept lines and markers with their exact count, or None if only markers fit."""
        units = self._units(text, identifiers)
        # The widest marker any gap can need: no gap holds more than the whole text.
        marker = self._counter.count(
            _marker(sum(u.num_lines for u in units), sum(u.tokens for u in units))
        )
        selected = [False] * len(units)
        order = sorted(range(len(units)), key=lambda i: units[i].rank)
        _fill(units, selected, order, marker, budget - marker)
        kept = [i for i in order if selected[i]]
        best: tuple[str, int, int, list[bool]] | None = None
        refills = 0
        while True:
            rendered, dropped = _render(units, selected)
            used = self._counter.count(rendered)
            if used <= budget:
                best = (rendered, used, dropped, selected.copy())
                if refills == _REFILLS or not _fill(units, selected, order, marker, budget - used):
                    break
                refills += 1
                continue
            if best is not None:  # a refill overshot: the last selection that fitted stands
                break
            if not kept:
                return None
            freed = 0
            while kept and freed < used - budget:  # drop the lowest-ranked kept units first
                i = kept.pop()
                selected[i] = False
                freed += units[i].cost
        rendered, used, dropped, selected = best
        if not any(selected):
            return None  # only markers: a plain prefix says more
        kept_units = [unit for unit, keep in zip(units, selected, strict=True) if keep]
        elided["similar lines"] = sum(unit.num_lines - 1 for unit in kept_units)
        elided["lines"] = dropped
        return rendered, used

    def _units(self, text: str, identifiers: tuple[str, ...]) -> list[_Unit]:
        count = self._counter.count
        lines = text.split("\n")
        spans = _spans(lines, _kinds(text, lines, identifiers))
        counts: dict[str, int] = {}  # logs repeat lines: count each distinct line once
        n = len(spans)
        units = []
        for position, (first, end, kind) in enumerate(spans):
            tokens = 0
            for line in lines[first:end]:
                tokens_of_line = counts.get(line)
                if tokens_of_line is None:
                    tokens_of_line = counts[line] = count(line)
                tokens += tokens_of_line
            body = lines[first]
            if end - first > 1:
                rest = tokens - counts[body]
                body += "\n" + _marker(end - first - 1, rest, similar=True)
            rank = _rank(kind, position, n)
            cost = tokens + 1 if end - first == 1 else count(body) + 1
            units.append(_Unit(body, end - first, tokens, cost, rank))
        return units


def _fill(
    units: list[_Unit], selected: list[bool], order: list[int], marker: int, room: int
) -> int:
    """Select units in rank order while their estimated cost fits in ``room``: tokens plus a
    newline, and one ``marker`` per maximal run of dropped units. Returns how many."""
    added = 0
    last = len(units) - 1
    for i in order:
        if selected[i]:
            continue
        left_open = i > 0 and not selected[i - 1]
        right_open = i < last and not selected[i + 1]
        gaps = 1 if left_open and right_open else -1 if not (left_open or right_open) else 0
        cost = units[i].cost + gaps * marker
        if cost <= room:
            selected[i] = True
            room -= cost
            added += 1
    return added


def _spans(lines: list[str], kinds: list[_Kind]) -> list[tuple[int, int, _Kind]]:
    """``(first line, end, kind)`` of each unit: one line, or a run of at least ``_MIN_RUN``
    near-identical plain lines (equal without digits, each number counting up or staying)."""
    blank = _DIGITS_OR_SPACES.sub
    keys: list[str | None] = [None] * len(lines)  # each line's key, computed once
    spans = []
    start = 0
    while start < len(lines):
        kind = kinds[start]
        end = start + 1
        if kind is _Kind.PLAIN:
            key = keys[start] if keys[start] is not None else blank(" ", lines[start])
            numbers: list[int] | None = None
            while end < len(lines) and kinds[end] is _Kind.PLAIN:
                following_key = keys[end] = blank(" ", lines[end])
                if following_key != key:
                    break
                if numbers is None:
                    numbers = _numbers(lines[start])
                following = _numbers(lines[end])
                if len(following) != len(numbers) or any(map(int.__lt__, following, numbers)):
                    break
                numbers = following
                end += 1
            if end - start < _MIN_RUN:
                end = start + 1
        spans.append((start, end, kind))
        start = end
    return spans


def _numbers(line: str) -> list[int]:
    return [int(digits) for digits in _DIGITS.findall(line)]


def _rank(kind: _Kind, position: int, n: int) -> tuple[int, int, int]:
    from_end = n - 1 - position
    if kind is _Kind.ERROR:
        return (0, 0, from_end)  # the last error is the most telling
    if kind is _Kind.CONTEXT:
        return (0, 1, from_end)
    if kind is _Kind.MENTION:
        return (1, 0, position)
    if from_end < _BAND:
        return (2, 0, from_end)
    if position < _BAND:
        return (3, 0, position)
    if kind is _Kind.ERROR_WORD:
        return (3, 1, from_end)
    return (4, min(position, from_end), position)


def _kinds(text: str, lines: list[str], identifiers: tuple[str, ...]) -> list[_Kind]:
    """Each line's kind."""
    starts = [0, *accumulate(len(line) + 1 for line in lines)]  # of each line in text
    candidates = _candidates(text, starts)
    error = {i for i in candidates if _ERROR.search(lines[i])}
    context: set[int] = set()
    after: set[int] = set()
    for i in sorted(error):
        traceback = lines[i].lstrip().startswith("Traceback (most recent call last)")
        limit = _TRACEBACK_LINES if traceback else _CONTEXT_LINES
        for j in range(i + 1, min(len(lines), i + 1 + limit)):
            if j in error:
                break
            if not lines[j][:1].isspace():
                if traceback:  # the exception line ends a traceback
                    context.add(j)
                else:
                    after.add(j)
                break
            context.add(j)
        for j in range(i - 1, max(i - 1 - _CONTEXT_LINES, -1), -1):
            if j in error or not lines[j][:1].isspace() or not lines[j].strip():
                break
            context.add(j)
    context |= {bisect_right(starts, match.start()) - 1 for match in _FRAME.finditer(text)}
    mentions = _mentions(text, starts, identifiers, len(lines))
    words = {i for i in candidates if _ERROR_WORD.search(lines[i])}
    kinds = [_Kind.PLAIN] * len(lines)
    for kind, indexes in (
        (_Kind.AFTER_ERROR, after),
        (_Kind.ERROR_WORD, words),
        (_Kind.MENTION, mentions),
        (_Kind.CONTEXT, context),
        (_Kind.ERROR, error),
    ):  # later kinds win
        for i in indexes:
            kinds[i] = kind
    return kinds


def _candidates(text: str, starts: list[int]) -> set[int]:
    """The lines ``_ERROR`` or ``_ERROR_WORD`` may match. ``str.find`` for their keywords is
    many times faster than the patterns, whose branches are tried at every position."""
    lowered = text.lower()
    if len(lowered) != len(text):  # a character lowercased to two: offsets would drift
        return set(range(len(starts) - 1))
    found = {0} if lowered.startswith(("e ", "e\t")) else set()
    for keyword in _KEYWORDS:
        at = lowered.find(keyword)
        while at >= 0:
            line = bisect_right(starts, at + len(keyword) - 1) - 1  # where the keyword ends
            found.add(line)
            at = lowered.find(keyword, starts[line + 1])  # the next line that holds it
    return found


def _mentions(
    text: str, starts: list[int], identifiers: tuple[str, ...], num_lines: int
) -> set[int]:
    """Lines that mention an identifier found on few lines; the others say nothing."""
    limit = max(_BAND, num_lines // _SELECTIVE)
    found: set[int] = set()
    for identifier in identifiers:
        lines: set[int] = set()
        for match in re.finditer(re.escape(identifier), text):
            lines.add(bisect_right(starts, match.start()) - 1)
            if len(lines) > limit:
                break
        else:
            found |= lines
    return found


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


def _identifiers(arguments: Mapping[str, Any]) -> tuple[str, ...]:
    found: set[str] = set()
    for value in _strings(arguments):
        value = value.strip()
        if _MIN_IDENTIFIER <= len(value) <= 200:
            found.add(value)
        for token in _IDENTIFIER.findall(value):
            if len(token) >= _MIN_IDENTIFIER or any(c in token for c in "_./"):
                found.add(token)
                found.update(part for part in token.split("/") if len(part) >= _MIN_IDENTIFIER)
    return tuple(sorted(found))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _reports_error(item: Any, flags: dict[int, bool] | None) -> bool:
    """Whether an array item holds an error, looked at once (by id: items are not hashable);
    never without ``flags``."""
    if flags is None:
        return False
    if id(item) not in flags:
        flags[id(item)] = _JSON_ERROR.search(json.dumps(item, ensure_ascii=False)) is not None
    return flags[id(item)]


def _collapse(
    value: Any, keep: int, items: list[int], flags: dict[int, bool] | None, cap: int | None
) -> Any:
    """``value`` with every array longer than ``keep`` cut to its first ``keep`` items and
    every item that reports an error (none without ``flags``), or, given a ``cap``, to its
    first ``cap`` error items (its first ``keep`` items if it has none); each gap noted."""
    if isinstance(value, dict):
        return {k: _collapse(v, keep, items, flags, cap) for k, v in value.items()}
    if not isinstance(value, list):
        return value
    if len(value) <= keep:
        return [_collapse(v, keep, items, flags, cap) for v in value]
    first = 0 if cap is not None else keep  # with a cap, error items come before first ones
    errors = [i for i in range(first, len(value)) if _reports_error(value[i], flags)]
    chosen = [*range(keep), *errors] if cap is None else errors[:cap] or list(range(keep))
    out: list[Any] = []
    previous = -1
    for i in [*chosen, len(value)]:
        if i > previous + 1:
            items[0] += i - previous - 1
            out.append(f"[... {i - previous - 1:,} more items elided ...]")
        if i < len(value):
            out.append(_collapse(value[i], keep, items, flags, cap))
        previous = i
    return out
