"""The generic reader: whole lines, ranked by what an agent needs from any text.

``read_lines`` reads every text (it is the fallback when no structure is recognised).
Lines that name the call's terms come first (only terms found on few lines pick anything
out); then lines that report an error (an exception named, a traceback header, an
upper-case level or verdict, an ``error:`` prefix, an OS error, a count of failures) with
their tracebacks and indented context; then, in text whose lines mostly repeat a few forms (records,
fields), the lines of a form seen once; then the tail and the head; then lines that merely
use an error word; then the rest, from both ends inwards. Runs of near-identical lines
(equal once digits are stripped, every number counting up or staying put, as in
``test_7 PASSED [ 3%]``) fold into their first line and a count; lines whose numbers jump
about (latencies, ids) carry information and stand alone.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from enum import IntEnum
from itertools import accumulate

from governor import TokenCounter
from policies.readers.pieces import Piece, Query, Reading, Tier

__all__ = ["VALUE", "is_alarm", "read_lines"]

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
_KEYWORDS = (
    "error",
    "exception",
    "warn",
    "fail",
    "fatal",
    "panic",
    "traceback",
    "critical",
    "severe",
    "denied",
    "refused",
    "not found",
    "no such file",
    "caused by",
    "during handling",
    "\ne ",
    "\ne\t",
)
_DIGITS = re.compile(r"\d+")
_DIGITS_OR_SPACES = re.compile(r"[\d\s]+")  # blanked, they leave what similar lines share
_MIN_RUN = 3  # a run of near-identical lines shorter than this is left alone
_CONTEXT_LINES = 5  # indented lines before and after an error line kept with it
_TRACEBACK_LINES = 40  # a traceback's body kept with its header, at most
_BAND = 10  # lines at each end that count as head and tail
# A value with a digit in it (a number, an id, a timestamp), masked where lines are
# compared by their form here and in ``logs``: from a token's start only, no backtracking.
VALUE = re.compile(r"(?<![^\s\[\](){}=:,;\"'])[^\s\[\](){}=:,;\"'\d]*+\d[^\s\[\](){}=:,;\"']*+")
_FORM_VALUE = re.compile(r":[ \t]*\"(?:[^\"\\\n]|\\[^\n])*\"")  # a quoted value after its key
_MIN_FORMS = 20  # fewer lines than this have no form to stand out from
_ONCE_SHARE = 0.2  # of the lines at most may be of a form seen once, for any to stand out


class _Kind(IntEnum):
    ERROR = 0
    CONTEXT = 1
    MENTION = 2
    ERROR_WORD = 3
    AFTER_ERROR = 4  # ranked as plain, but never collapsed: it shows what came next
    PLAIN = 5
    STANDOUT = 6  # ranked after errors: the one line of its form in repetitive text


def is_alarm(line: str) -> bool:
    """Whether one line reports an error (or is a stack frame), as ``read_lines`` ranks it.
    Its keywords are looked for first: the patterns are many times slower."""
    lowered = line.lower()
    if (line.startswith(("E ", "E\t")) or any(k in lowered for k in _KEYWORDS)) and _ERROR.search(
        line
    ):
        return True
    framed = 'File "' in line or "at " in line or " more" in line or ": in " in line
    return framed and _FRAME.search(line) is not None


def read_lines(text: str, query: Query, *, counter: TokenCounter) -> Reading:
    """Every line of ``text`` as a piece (runs of similar lines as one), ranked."""
    lines = text.split("\n")
    spans = _spans(lines, _kinds(text, lines, query))
    counts: dict[str, int] = {}  # logs repeat lines: count each distinct line once
    n = len(spans)
    pieces = []
    for position, (first, end, kind) in enumerate(spans):
        tokens = 0
        for line in lines[first:end]:
            tokens_of_line = counts.get(line)
            if tokens_of_line is None:
                tokens_of_line = counts[line] = counter.count(line)
            tokens += tokens_of_line
        body = lines[first]
        pieces.append(
            Piece(body, _rank(kind, position, n), "lines", end - first, end - first - 1, tokens)
        )
    return Reading("extractive", tuple(pieces))


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


def _rank(kind: _Kind, position: int, n: int) -> tuple[int, ...]:
    from_end = n - 1 - position
    if kind is _Kind.MENTION:
        return (Tier.ASKED, 0, position)
    if kind is _Kind.ERROR:
        return (Tier.ALARM, 0, from_end)  # the last error is the most telling
    if kind is _Kind.CONTEXT:
        return (Tier.ALARM, 1, from_end)
    if kind is _Kind.STANDOUT:
        return (Tier.STANDOUT, from_end)
    if from_end < _BAND:  # the tail: verdicts, exit codes, the final error
        return (Tier.CONTEXT, 0, from_end)
    if position < _BAND:  # the head: the command, headers, the first results
        return (Tier.CONTEXT, 1, position)
    if kind is _Kind.ERROR_WORD:
        return (Tier.CONTEXT, 2, from_end)
    return (Tier.REST, min(position, from_end), position)


def _kinds(text: str, lines: list[str], query: Query) -> list[_Kind]:
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
    mentions = query.picks(text, starts[:-1])
    words = {i for i in candidates if _ERROR_WORD.search(lines[i])}
    kinds = [_Kind.PLAIN] * len(lines)
    for kind, indexes in (
        (_Kind.STANDOUT, _standouts(lines)),
        (_Kind.AFTER_ERROR, after),
        (_Kind.ERROR_WORD, words),
        (_Kind.MENTION, mentions),
        (_Kind.CONTEXT, context),
        (_Kind.ERROR, error),
    ):  # later kinds win
        for i in indexes:
            kinds[i] = kind
    return kinds


def _standouts(lines: list[str]) -> set[int]:
    """The lines of a form no other line has, where most lines share their form with
    others (records, fields, a listing): a field seen once among repeated ones. A line's
    form is the line with its values masked (numbers, ids, quoted values)."""
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if len(filled) < _MIN_FORMS:
        return set()
    # One pass over the whole text: neither pattern crosses a line's end.
    forms = _FORM_VALUE.sub(": _", VALUE.sub("#", "\n".join(lines))).split("\n")
    seen = Counter(forms[i] for i in filled)
    once = {i for i in filled if seen[forms[i]] == 1}
    return once if len(once) <= len(filled) * _ONCE_SHARE else set()


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
