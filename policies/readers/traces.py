"""Stack traces (Python, JVM, Node, Go), alone or inside a log: what was raised, and where
in the user's code.

Read when the text holds at least one trace (``_stack_traces.find_traces``). Each trace
keeps first its exception lines, the chain's causes included (ALARM), then its innermost
frames of user code, innermost first (CONTEXT; frames in site-packages, node_modules,
``java.*``, Go's runtime and the like are not the user's), and folds the other frames
into counted runs (REST). A Go dump keeps the panic and the panicking goroutine; every
other goroutine is one counted piece. A trace that repeats an earlier one adds its
exception line only, after every first occurrence's frames. Two traces or more are
counted by exception in a SHAPE line. The lines outside traces are pieces too: ERROR and
FATAL entries are ALARM (a repeat of an earlier entry, numbers aside, is REST), entries
naming the call's terms ASKED, the rest REST, nearest the traces first.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter

from policies.readers._stack_traces import PartKind, Trace, find_traces, parts
from policies.readers.pieces import Piece, Query, Reading, Tier

__all__ = ["read_traces"]

_MAY_HOLD = ("Traceback (most recent call last)", "\tat ", "    at ", "goroutine ")
# A level word: its first letter is looked for before the words are tried.
_LEVEL = re.compile(
    r"(?=[ACEFPSWl\"])(?<!\w)(?:(?P<severe>ERROR|ERR|FATAL|CRITICAL|CRIT|SEVERE|PANIC|EMERG"
    r"|ALERT)\b|(?P<warning>WARNING|WARN)\b|level=\"?(?:(?P<severe_>error|fatal|critical|panic)"
    r"|(?P<warning_>warn))|\"level\": ?\"(?:(?P<severe__>error|fatal|critical)"
    r"|(?P<warning__>warn)))"
)
_KLOG = re.compile(r"[EFW]\d{4} ")
_DIGITS = re.compile(r"\d+")
_THREAD = re.compile(r'Exception in thread "[^"]*" ')
_HEAD = 160  # characters of a log line that hold its level
_NUM_USER_FRAMES = 4  # innermost user frames kept per exception
_NEAR = 3  # log lines this close before or after a trace rank first among the rest
_FAR = 1 << 30  # no trace on that side
_SELECTIVE = 10  # a term on over 1/10 of the lines picks nothing out
_SHOWN_KINDS = 4  # exceptions named in the SHAPE line


def read_traces(text: str, query: Query) -> Reading | None:
    if not any(marker in text for marker in _MAY_HOLD):
        return None
    lines = text.splitlines()
    traces = find_traces(lines)
    if not traces:
        return None
    return Reading("traces", tuple(_Reader(lines, traces, query).pieces()))


class _Reader:
    """The pieces of one text: its traces and the log lines around them, in order."""

    def __init__(self, lines: list[str], traces: list[Trace], query: Query) -> None:
        self.lines = lines
        self.traces = traces
        self.starts = [t.start for t in traces]
        self.ends = [t.end for t in traces]
        limit = max(_SELECTIVE, len(lines) // _SELECTIVE)
        joined = "\n".join(lines)
        self.terms = tuple(t for t in query.terms if 0 < joined.count(t) <= limit)
        self.seen: set[str] = set()  # trace signatures and ERROR entries met so far

    def pieces(self) -> list[Piece]:
        out: list[Piece] = []
        if len(self.traces) > 1:
            out.append(Piece(self.summary(), (Tier.SHAPE, 0)))
        i = 0
        for index, trace in enumerate(self.traces):
            out.extend(self.log_lines(i, trace.start, index))
            signature = trace.signature(self.lines)
            repeat = signature in self.seen
            self.seen.add(signature)
            out.extend(self.trace_pieces(trace, index, repeat))
            i = trace.end
        out.extend(self.log_lines(i, len(self.lines), len(self.traces)))
        return out

    def asked(self, text: str) -> bool:
        return any(term in text for term in self.terms)

    def summary(self) -> str:
        """``[traces: 12 (httpx.ReadTimeout 11, sqlite3.OperationalError 1)]``."""
        kinds: Counter[str] = Counter()
        for trace in self.traces:
            raised = [e for e in trace.exceptions if e.end > e.start and e.role == 0]
            line = self.lines[raised[0].start] if raised else ""
            kind = _THREAD.sub("", line.strip()).split(":", 1)[0].strip()[:60]
            kinds[kind or "trace"] += 1
        top = kinds.most_common(_SHOWN_KINDS)
        shown = ", ".join(f"{kind} {n:,}" for kind, n in top)
        others = len(self.traces) - sum(n for _, n in top)
        if others:
            shown += f", others {others:,}"
        return f"[traces: {len(self.traces):,} ({shown})]"

    def trace_pieces(self, trace: Trace, index: int, repeat: bool) -> list[Piece]:
        out: list[Piece] = []
        kept = 0 if repeat else _NUM_USER_FRAMES
        for part in parts(trace, self.lines, num_kept=kept, keep=self.asked):
            shown = [line.rstrip() for line in self.lines[part.start : part.end] if line.strip()]
            if not shown:
                continue
            text = "\n".join(shown)
            what, count = "lines", len(shown)
            kind = part.kind
            if kind is PartKind.FRAMES:
                what, count = "frames", part.count
            elif kind is PartKind.GOROUTINE:
                what, count = "goroutines", 1
            if kind is PartKind.MESSAGE:
                # A repeat's message says the trace happened again: after the first
                # occurrences' frames.
                rank: tuple[float, ...] = (
                    (Tier.CONTEXT, 2, index, part.order)
                    if repeat
                    else (Tier.ALARM, 0, index, part.order)
                )
            elif repeat:
                rank = (Tier.REST, 5, index, part.start)
            elif kind is PartKind.DETAIL and part.order == 0:
                rank = (Tier.CONTEXT, 0, -1, index, part.role)
            elif kind is PartKind.FRAME:
                rank = (Tier.CONTEXT, 0, part.order, index, part.role)
            elif kind is PartKind.SOURCE:
                rank = (Tier.CONTEXT, 0, -1, index, -1)
            elif kind is PartKind.GLUE:
                rank = (Tier.CONTEXT, 1, index, part.start)
            elif kind is PartKind.GOROUTINE:
                rank = (Tier.REST, 1 if part.user else 3, index, part.start)
            else:  # the other frames, a message's further lines
                rank = (Tier.REST, 2, index, part.start)
            if rank[0] > Tier.ASKED and kind is not PartKind.FRAMES and self.asked(text):
                rank = (Tier.ASKED, 0, index, part.start)
            out.append(Piece(text, rank, what, count))
        return out

    def log_lines(self, start: int, end: int, next_trace: int) -> list[Piece]:
        """The lines between traces, each a piece: the entry just above a trace ranks
        with its exception, the others by level and nearness."""
        lines = self.lines
        entry = end - 1
        while entry >= start and not lines[entry].strip():
            entry -= 1
        out: list[Piece] = []
        for i in range(start, end):
            line = lines[i].rstrip()
            if not line:
                continue
            level = _level(line)
            repeat = False
            if level == "severe":  # an error logged again (numbers aside) adds nothing
                template = _DIGITS.sub("#", line)
                repeat = template in self.seen
                self.seen.add(template)
            if self.terms and self.asked(line):
                rank: tuple[float, ...] = (Tier.ASKED, 0, i)
            elif level == "severe" and not repeat:
                above = i == entry and next_trace < len(self.traces)
                rank = (Tier.ALARM, 0, next_trace, -1) if above else (Tier.ALARM, 1, i)
            elif level:
                rank = (Tier.REST, 0, i)
            else:
                distance = self.distance(i)
                rank = (Tier.REST, 1 if distance <= _NEAR else 4, distance, i)
            out.append(Piece(line, rank))
        return out

    def distance(self, i: int) -> int:
        """Lines between line ``i`` (outside every trace) and the nearest trace."""
        k = bisect_left(self.starts, i)
        after = self.starts[k] - i if k < len(self.starts) else _FAR
        before = i - self.ends[k - 1] + 1 if k > 0 else _FAR
        return min(after, before)


def _level(line: str) -> str:
    """``severe`` (ERROR and worse), ``warning`` or ``""``: the first level word."""
    if _KLOG.match(line):
        return "warning" if line[0] == "W" else "severe"
    found = _LEVEL.search(line, 0, _HEAD)
    return "" if found is None else (found.lastgroup or "").rstrip("_")
