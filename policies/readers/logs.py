"""Logs (application, syslog and journald, klog, access logs): what went wrong, what the
call names, what happened once.

A log is read when most of its lines start like log entries (a timestamp, a level, an
access-log prefix); a line that does not is a continuation of the entry before. A summary
comes first: the entries, their time range, the count of each level and the most
repeated messages with their counts (numbers, ids and addresses masked). An entry longer
than a few lines (a traceback under it) is split into its lines, what was raised first;
a run of alike entries (the same once masked) folds into its first and a count. Then entries
naming the call's terms (a term on few entries, ``Query.picks``); then ERROR and worse (and 5xx
responses), most relevant to the question first, the latest first; then WARN, 4xx and
entries whose masked message occurs once; then the tail and the head; then the rest.
"""

from __future__ import annotations

import re
from collections import Counter

from policies.readers.lines import VALUE
from policies.readers.pieces import Piece, Query, Reading, Tier
from policies.readers.relevance import Relevance

__all__ = ["read_log"]

_START = re.compile(
    r"\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}"  # ISO 8601
    r"|[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} "  # syslog
    r"|\d{2}:\d{2}:\d{2}[.,\d]* "  # a time of day
    r"|[IWEF]\d{4} \d{2}:\d{2}:\d{2}"  # klog
    r"|\S+ \S+ \S+ \[\d{2}/\w{3}/\d{4}:"  # common and combined access logs
    r"|\[?(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|FATAL|CRITICAL)\b"
    r"|(?:time|ts)=\S+ |level=\w+"
)
_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}"
    r"|\d{2}/\w{3}/\d{4}:\d{2}:\d{2}:\d{2}(?: [+-]\d{4})?"
    r"|\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
)
_LEVEL = re.compile(
    r"\b(TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|ERR|FATAL|CRITICAL|CRIT|ALERT|EMERG"
    r"|SEVERE|PANIC|trace|debug|info|notice|warn|warning|error|err|fatal|critical|panic)\b"
)
_KLOG = re.compile(r"([IWEF])\d{4} ")
_ACCESS = re.compile(r"\S+ \S+ \S+ \[\d{2}/\w{3}/\d{4}:")
_STATUS = re.compile(r'" ([1-5]\d\d) ')  # an access log's response status
# Numbers, and every token holding a digit (ids, addresses, keys, veth4a0b7c): masked, the
# entries of one message look alike.
# Trouble said in words, for entries with no level (syslog, journald, kernel lines).
_TROUBLE = re.compile(
    r"(?i)\b(?:error|errors|fail|failed|failure|fatal|panic|critical|crash|crashed|abort"
    r"|aborted|segfault|killed|oom|out of memory|denied|refused|timed out|timeout"
    r"|unreachable|exception|core dumped|traceback)\b"
)
# Levels above WARN; E and F are klog's.
_SEVERE = frozenset(("ERROR", "ERR", "FATAL", "CRITICAL", "CRIT", "ALERT", "EMERG", "SEVERE"))
_SEVERE |= {"PANIC", "E", "F"}
_WARNING = frozenset(("WARN", "WARNING", "W"))
# A continuation line that says what was raised: an exception, a panic, its cause.
_RAISED = re.compile(
    r"\s*(?:[\w.$]*(?:Error|Exception|Exit|Interrupt)\b|Traceback \(|panic: |Caused by: |"
    r"fatal error: |thread '.*' panicked)"
)
_WHOLE = 4  # an entry of more lines than this is split into its lines
_MIN_RUN = 3  # alike entries in a row fold into the first and a count from this many
_MIN_ENTRIES = 20  # fewer entries than this are not worth reading as a log
_SHARE = 0.6  # of non-blank lines that must start like an entry
_BAND = 5  # entries at each end that count as tail and head
_REPEATS = 3  # most repeated messages named in the summary
_SHOWN = 48  # characters of a repeated message shown in the summary


def read_log(text: str, query: Query) -> Reading | None:
    lines = text.split("\n")
    entries = _entries(lines)
    if entries is None:
        return None
    firsts = [lines[first] for first, _ in entries]
    access = sum(1 for line in firsts if _ACCESS.match(line)) > len(firsts) // 2
    levels = [_level(line, access=access) for line in firsts]
    templates = [VALUE.sub("#", line) for line in firsts]
    repeats = Counter(templates)
    relevance = Relevance(query.words, firsts)
    mentions = query.picks_in(firsts)
    n = len(entries)
    ranks = []
    for position, ((first, end), level) in enumerate(zip(entries, levels, strict=True)):
        from_end = n - 1 - position
        score = -relevance.score(firsts[position]) if relevance else 0.0
        raised = end - first > 1 and any(_RAISED.match(line) for line in lines[first + 1 : end])
        if position in mentions:  # what went wrong first, among entries the call names
            trouble = 0 if level in _SEVERE or raised else 1 if level in _WARNING else 2
            rank: tuple[float, ...] = (Tier.ASKED, trouble, score, position)
        elif level in _SEVERE or raised or (not level and _TROUBLE.search(firsts[position])):
            rank = (Tier.ALARM, score, from_end)
        elif level in _WARNING:
            rank = (Tier.STANDOUT, 0, score, from_end)
        elif repeats[templates[position]] == 1 and n > _MIN_ENTRIES:
            rank = (Tier.STANDOUT, 1, score, from_end)
        elif from_end < _BAND:
            rank = (Tier.CONTEXT, 0, from_end)
        elif position < _BAND:
            rank = (Tier.CONTEXT, 1, position)
        else:
            rank = (Tier.REST, score, min(position, from_end), position)
        ranks.append(rank)
    shape, repeated = _summary(firsts, levels, templates)
    pieces = [Piece(shape, (Tier.SHAPE, 0), "entries", 0)]
    if repeated:  # what the rest mostly says: after what was asked for and what went wrong
        pieces.append(Piece(repeated, (Tier.CONTEXT, -1), "entries", 0))
    position = 0
    while position < n:
        first, end = entries[position]
        rank = ranks[position]
        run = position + 1  # a run of one-line entries alike once numbers are masked
        while (
            end - first == 1
            and run < n
            and templates[run] == templates[position]
            and entries[run][1] - entries[run][0] == 1
            and ranks[run][0] >= Tier.CONTEXT
        ):
            run += 1
        if rank[0] >= Tier.CONTEXT and run - position >= _MIN_RUN:
            source = "\n".join(lines[first : entries[run - 1][1]])
            folded = run - position - 1
            pieces.append(
                Piece(lines[first], rank, "entries", run - position, folded, None, source)
            )
            position = run
            continue
        position += 1
        if end - first <= _WHOLE:
            pieces.append(Piece("\n".join(lines[first:end]), rank, "entries"))
            continue
        # A long entry (a traceback, a dump): its lines stand alone, what was raised first.
        pieces.append(Piece(lines[first], rank, "entries"))
        for i in range(first + 1, end):
            alarm = _RAISED.match(lines[i]) is not None
            pieces.append(Piece(lines[i], (*rank, 0 if alarm else 1, end - i), "lines"))
    return Reading("log", tuple(pieces))


def _entries(lines: list[str]) -> list[tuple[int, int]] | None:
    """``(first line, end)`` of each entry; None when too few lines start like one."""
    starts = [i for i, line in enumerate(lines) if line and _START.match(line)]
    nonblank = sum(1 for line in lines if line.strip())
    if len(starts) < _MIN_ENTRIES or len(starts) < _SHARE * nonblank:
        return None
    entries = []
    if starts[0] > 0:
        entries.append((0, starts[0]))  # what came before the first entry: a header
    for k, first in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        while end - 1 > first and not lines[end - 1].strip():
            end -= 1  # trailing blank lines belong to no entry
        entries.append((first, end))
    return entries


def _level(line: str, *, access: bool) -> str:
    head = line[:120]
    if (klog := _KLOG.match(head)) is not None:
        return klog.group(1)
    if access and (status := _STATUS.search(line)) is not None:
        code = status.group(1)
        return "ERROR" if code[0] == "5" else "WARN" if code[0] == "4" else "INFO"
    found = _LEVEL.search(head)
    return found.group(1).upper() if found else ""


def _summary(firsts: list[str], levels: list[str], templates: list[str]) -> tuple[str, str]:
    """The entries, their time range and levels; and, apart, the most repeated messages."""
    times = [m.group(0) for line in (firsts[0], firsts[-1]) if (m := _TIME.search(line))]
    span = f", {times[0]} to {times[-1]}" if len(times) == 2 else ""
    counted = Counter(level for level in levels if level)
    by_level = ", ".join(f"{level} {n:,}" for level, n in counted.most_common())
    repeats = Counter(templates)
    example = dict(zip(templates, firsts, strict=True))
    # Each message as its entries share it: "#" for what differs (a package, an id).
    repeated = [
        f"{n:,}x {_message(example[template])!r}"
        for template, n in repeats.most_common(_REPEATS)
        if 1 < n < len(firsts)  # a message every entry shares says nothing
    ]
    parts = [f"log: {len(firsts):,} entries{span}", by_level]
    shape = "[" + "; ".join(part for part in parts if part) + "]"
    return shape, "[most repeated: " + "; ".join(repeated) + "]" if repeated else ""


def _message(line: str) -> str:
    """An entry without its timestamp, what differs between alike entries masked, cut to
    ``_SHOWN`` characters."""
    found = _TIME.search(line, 0, 40)
    message = VALUE.sub("#", line[found.end() :] if found else line)
    message = message.strip(" []")
    return message if len(message) <= _SHOWN else message[: _SHOWN - 1] + "…"
