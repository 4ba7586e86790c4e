"""Compiler, linter and test-runner output: every error and failure with its location and
message, then the lines that explain it, then counts of the rest.

Read when lines only these tools print are found (``_diagnostic_lines``): pytest,
unittest, ``go test``/``go build``/``go vet``, rustc and cargo, tsc, ESLint, mypy, ruff,
gcc, javac, Maven (with surefire), Gradle, Jest; a JUnit XML report goes to
``_junit_xml``. A plain log that merely says "error" has none of these lines.

Each error or failure is ALARM (ASKED when it names the call's terms): a compiler's
error with its ``-->`` location, a linter's finding, a test-summary line, a failure's
head with its message (pytest's first ``E`` line and the ``file:line: Error`` that ends
it, the exception of a traceback, a Go test's ``x_test.go:42:`` line). The lines that
explain it come next (CONTEXT): a source snippet, further ``E`` lines, the failing
``>`` line, the innermost frames of the test's code. The verdict lines and counts of the
warnings and errors by kind are SHAPE. Warnings stand out when nothing failed and wait
behind everything else when something did. Passing tests and progress are REST, long
runs of them one counted piece.
"""

from __future__ import annotations

import re
from collections import Counter

from policies.readers._diagnostic_lines import classify, is_strong
from policies.readers._diagnostic_units import Role, Unit, parse_units
from policies.readers._junit_xml import read_junit
from policies.readers.pieces import Piece, Query, Reading, Tier

__all__ = ["read_diagnostics"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_ERRORISH = re.compile(r"(?i)\b(?:error|fail(?:ed|ure)?|fatal|panic|exception)\b")
_MIN_ERRORS = 3  # errors counted by kind in a SHAPE line from this many on
_MIN_WARNINGS = 2
_SHOWN_KINDS = 4
_SMALL = 40  # an output this short is diagnostics on one telling line
_SELECTIVE = 10  # a term on over 1/10 of the lines picks nothing out


def read_diagnostics(text: str, query: Query) -> Reading | None:
    junit = read_junit(text, query)
    if junit is not None:
        return junit
    lines = [line.rstrip() for line in text.splitlines()]
    if "\x1b[" in text:
        lines = [_ANSI.sub("", line) for line in lines]
    known: dict[str, str | None] = {}  # outputs repeat lines ("  |", "[INFO]")
    kinds: list[str | None] = []
    for line in lines:
        if not line:
            kinds.append(None)
        elif (kind := known.get(line, "")) == "":
            kinds.append(known.setdefault(line, classify(line)))
        else:
            kinds.append(kind)
    strong = sum(1 for kind in kinds if kind is not None and is_strong(kind))
    nonblank = sum(1 for line in lines if line)
    if strong < 2 and not (strong == 1 and nonblank <= _SMALL):
        return None
    terms = _selective_terms(query, lines)
    units = parse_units(lines, kinds, terms)
    for j, kind in enumerate(kinds):
        if kind == "rule":
            lines[j] = ""  # a separator says nothing the pieces' order does not
    return Reading("diagnostics", tuple(_pieces(units, lines, terms)))


def _pieces(units: list[Unit], lines: list[str], terms: tuple[str, ...]) -> list[Piece]:
    failed = any(u.role is Role.ALARM for u in units)
    texts = [
        lines[u.start] if u.end == u.start + 1 else "\n".join(filter(None, lines[u.start : u.end]))
        for u in units
    ]
    asked = [False] * len(units)
    if terms:  # a block or a file named by the call is asked for, all its lines
        asked = [any(t in text for t in terms) for text in texts]
        blocks = {u.block for u, a in zip(units, asked, strict=True) if a and u.block}
        headers = {id(u) for u, a in zip(units, asked, strict=True) if a}
        asked = [
            a or u.block in blocks or id(u.header) in headers
            for u, a in zip(units, asked, strict=True)
        ]
    warnings = Counter(u.kind for u in units if u.role is Role.WARNING)
    errors = Counter(u.kind for u in units if u.role is Role.ALARM and u.kind)
    summaries: dict[int, list[str]] = {}  # unit index -> count lines shown before it
    if sum(errors.values()) >= _MIN_ERRORS:
        first = next(k for k, u in enumerate(units) if u.role is Role.ALARM and u.kind)
        summaries.setdefault(first, []).append(_summary("errors", errors))
    if sum(warnings.values()) >= _MIN_WARNINGS:
        first = next(k for k, u in enumerate(units) if u.role is Role.WARNING)
        summaries.setdefault(first, []).append(_summary("warnings", warnings))
    seen_kinds: set[str] = set()
    ranks = [
        _rank(unit, texts[k], asked[k], failed, warnings, seen_kinds)
        for k, unit in enumerate(units)
    ]
    best: dict[int, tuple[float, ...]] = {}  # a file's name ranks as its best finding
    for unit, rank in zip(units, ranks, strict=True):
        if unit.header is not None:
            key = id(unit.header)
            if key not in best or rank < best[key]:
                best[key] = rank
    pieces: list[Piece] = []
    for k, unit in enumerate(units):
        for line in summaries.get(k, ()):
            pieces.append(Piece(line, (Tier.SHAPE, 0, unit.start)))
        text = texts[k]
        if not text:
            continue
        rank = ranks[k]
        if unit.role is Role.HEADER:
            rank = (*best.get(id(unit), (Tier.REST, 3, 0))[:-1], unit.start)
        if unit.what != "lines":
            pieces.append(Piece(text, rank, unit.what, max(1, unit.count)))
        elif unit.count > 0 and (unit.role is Role.PASS or unit.role is Role.PROGRESS):
            pieces.append(Piece(text, rank, "passing tests", unit.count))
        else:
            pieces.append(Piece(text, rank, "lines", text.count("\n") + 1))
    return pieces


def _rank(
    unit: Unit,
    text: str,
    asked: bool,
    failed: bool,
    warnings: Counter[str],
    seen_kinds: set[str],
) -> tuple[float, ...]:
    role, at = unit.role, unit.start
    if role is Role.VERDICT:
        # A run that failed: its failures tell more than its counts, at any budget; the
        # counts before the marks of each failure (the [ERROR] lines repeating them).
        return (Tier.ALARM, 1.5, 0, at) if failed else (Tier.SHAPE, 1, at)
    if asked and role in (Role.ALARM, Role.WARNING, Role.PASS, Role.OTHER, Role.HEADER):
        return (Tier.ASKED, 0, at)
    if role is Role.ALARM:
        return (Tier.ALARM, unit.group, unit.block if unit.group == 1 else 0, at)
    if role is Role.CONTEXT:
        return (Tier.CONTEXT, 0 if asked else 1, unit.block, at)
    if role is Role.WARNING:
        if not failed and unit.kind not in seen_kinds:
            seen_kinds.add(unit.kind)
            return (Tier.STANDOUT, warnings[unit.kind], at)
        return (Tier.REST, 0, 0, at)
    if role is Role.OTHER:
        return (Tier.REST, 1 if _ERRORISH.search(text) else 3, 0, at)
    if role is Role.BODY:
        return (Tier.REST, 2, unit.block, at)
    if role is Role.WARNING_BODY:
        return (Tier.REST, 4, 0, at)
    if role is Role.NOISE:
        return (Tier.REST, 5, 0, at)
    if role is Role.HEADER:
        return (Tier.REST, 3, 0, at)
    return (Tier.REST, 6, 0, at)  # passing tests and progress


def _summary(label: str, counts: Counter[str]) -> str:
    """``[warnings: 41 (no-unused-vars 30, no-explicit-any 11)]``."""
    total = sum(counts.values())
    top = counts.most_common(_SHOWN_KINDS)
    shown = ", ".join(f"{kind} {n:,}" for kind, n in top)
    others = total - sum(n for _, n in top)
    if others:
        shown += f", others {others:,}"
    return f"[{label}: {total:,} ({shown})]"


def _selective_terms(query: Query, lines: list[str]) -> tuple[str, ...]:
    limit = max(_SELECTIVE, len(lines) // _SELECTIVE)
    found = []
    for term in query.terms:
        hits = sum(1 for line in lines if term in line)
        if 0 < hits <= limit:
            found.append(term)
    return tuple(found)
