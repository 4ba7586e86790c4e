"""What a reader makes of a tool output: pieces ranked by what the agent needs.

A reader (one per kind of structure: JSON, tables, diffs, diagnostics, logs, stack
traces, listings, prose) turns a tool output into a ``Reading``: the pieces of the text
in the order they are shown, each with a rank (lower is kept first) and what it stands
for when it is left out. ``fit`` (``policies.readers.fit``) keeps pieces in rank order
while they fit the budget and marks every run of left-out pieces with what it held.

Readers rank by the same tiers, so that a reading is ordered the way an agent would
read it: first the shape that makes the rest legible (a table's header, a diff's file
headers, the counts of what follows), then what the call asked for, then what went
wrong, then what stands out, then context, then the rest.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from policies.readers.relevance import words

__all__ = ["Piece", "Query", "Reading", "Tier"]


class Tier(IntEnum):
    """The first element of every rank: readers agree on what comes first."""

    SHAPE = 0  # short: a header, file and hunk headers, counts and ranges of the rest
    ASKED = 1  # names what the call's arguments or the agent's question name
    ALARM = 2  # an error, a failure, an exception: what went wrong
    STANDOUT = 3  # unlike its siblings: a value seen once, an outlier, a warning
    CONTEXT = 4  # next to an asked-for or alarming piece, and needed to read it
    REST = 5


@dataclass(frozen=True, slots=True)
class Piece:
    """A kept-or-left-out part of a reading: one or more whole lines of ``text``.

    ``rank`` orders the pieces of one reading (its first element a ``Tier``; lower is
    kept first). ``what`` and ``count`` say what the piece stands for when it is left
    out: ``("rows", 1)`` for a table row, ``("lines", 12)`` for a collapsed run.
    ``folded`` counts the similar ``what`` that follow its text in the output and are
    shown only as a count (a run of 40 similar lines is its first line, folding 39);
    ``source`` is then the whole run's text. ``tokens``, where the reader counted them,
    are the tokens of what the piece stands for: its text's, or the whole run's.
    """

    text: str
    rank: tuple[float, ...]
    what: str = "lines"
    count: int = 1
    folded: int = 0
    tokens: int | None = None
    source: str | None = None


@dataclass(frozen=True, slots=True)
class Reading:
    """A reader's account of one output: ``method`` names the reader (``"json"``)."""

    method: str
    pieces: tuple[Piece, ...]


_IDENTIFIER = re.compile(r"[A-Za-z_][\w.\-/]*\w|\b\d[\w.\-/]*[A-Za-z_][\w.\-/]*\w")
# What a question names exactly: an id, an address, a version (a token holding a digit).
_SPECIFIC = re.compile(r"(?<![\w.:/-])[\w.:/-]*\d[\w.:/-]*\w")
_COMMAND_KEYS = frozenset(("command", "cmd", "shell", "script", "run", "bash", "sh"))
_SEGMENT = re.compile(r"\s*(?:\|\|?|&&|;)\s*")
# Programs whose first operand is a subcommand (git show, kubectl get, pip list).
_SUBCOMMANDS = frozenset(
    re.findall(
        r"\S+",
        "git kubectl docker podman pip pip3 npm pnpm yarn cargo go gh helm systemctl apt "
        "apt-get brew uv poetry dotnet mvn gradle terraform aws gcloud az",
    )
)
_FORMAT_FLAGS = frozenset(("-o", "--output", "--format", "-f", "--output-format"))
_MIN_TERM = 4  # shorter plain words in arguments match too much
_FEW = 10  # a term in at most this many parts always picks them
# A code identifier: snake_case, SCREAMING_CASE, camelCase or PascalCase with an inner capital.
_NAME = re.compile(r"\b(?:[A-Za-z]\w*_\w+|[a-z]+[A-Z]\w*|[A-Z][a-z0-9]+[A-Z]\w*|[A-Z]{3,}\d*)\b")
_HOW = re.compile(r"(?i)\bhow (many|long|often|big|large|much)\b(?:\s+(?:\w+\s+)?([a-z]{3,}))?")
_TIMES = ("ms", "milliseconds", "s", "seconds", "sec", "minutes", "min", "hours", "h", "days", "d")
_SIZES = ("B", "KB", "KiB", "MB", "MiB", "GB", "GiB", "TB", "TiB", "bytes", "K", "M", "G")
_UNITS = {"long": _TIMES, "often": _TIMES, "big": _SIZES, "large": _SIZES, "much": _SIZES}
# A question whose answer is a number or a setting's value.
_QUANTITY = re.compile(
    r"(?i)\bhow (?:many|much|long|often|big|large|high|low|fast|slow|old)\b"
    r"|\b(?:what|which) (?:is|was|are|were) (?:the |it |its |they )?"
    r"(?:default|limit|value|size|timeout|maximum|minimum|max|min|number|count|version|port)"
    r"|\b(?:set|default|defaults|configured|changed) (?:to|it to)\b|\bwhat (?:was|is) it set\b"
    r"|\bnumber of\b|\bto what\b"
)
_SELECTIVE = 10  # a term in over 1/10 of the parts (and over _FEW) picks out nothing
_STOPWORDS = frozenset(
    re.findall(
        r"\w+",
        "a an and are as at be by can did do does for from has have how i in is it its me my "
        "no not of on or our show tell that the their them then there these this to was we "
        "what when where which who why will with you your please find get list give need "
        "all any some about into out up",
    )
)


@dataclass(frozen=True, slots=True)
class Query:
    """What the agent asked for: the tool call and the agent's last request.

    ``terms`` are the selective strings of the call's arguments: whole values and the
    identifiers in them (``src/app/models.py``, ``models.py``, ``user_4821``), and the ids,
    addresses and versions the question names (``10.0.4.17``, ``ord_48213``), to find
    verbatim. ``words`` are the content words (``relevance.words``) of the arguments and of
    ``question`` (the last user or assistant turn before the call), to score prose by.
    ``picks`` finds the parts of a text that hold a selective term. ``quantity`` says the
    question asks for a number or a setting's value (how many, what is the default).
    ``names`` are the code identifiers the arguments and the question name; ``measures``
    what the number asked for is counted in (``connections`` for "how many client
    connections", time units for "how long").
    A reader may read these, never anything about the answer.
    """

    tool_name: str | None = None
    arguments: Mapping[str, Any] | None = None
    question: str = ""
    terms: tuple[str, ...] = ()
    words: frozenset[str] = frozenset()
    quantity: bool = False
    names: tuple[str, ...] = ()
    measures: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        question: str | None = None,
    ) -> Query:
        arguments = arguments or {}
        question = question or ""
        values = [
            _operands(value) if key in _COMMAND_KEYS else value
            for key, item in arguments.items()
            for value in _strings(item)
        ]
        found = {w for text in (*values, question) for w in words(text, skip=_STOPWORDS)}
        return cls(
            tool_name=tool_name,
            arguments=arguments,
            question=question,
            terms=_terms([*values, *_SPECIFIC.findall(question)]),
            words=frozenset(w for w in found if len(w) > 1),
            quantity=_QUANTITY.search(question) is not None,
            names=tuple(sorted({n for text in (*values, question) for n in _NAME.findall(text)})),
            measures=_measures(question),
        )

    def mentions(self, text: str) -> bool:
        """Whether ``text`` holds one of the call's terms verbatim."""
        return any(term in text for term in self.terms)

    def picks_in(self, texts: Sequence[str]) -> set[int]:
        """The indexes of ``texts`` that hold a selective term (``picks``)."""
        if not self.terms or not texts:
            return set()
        starts = [0]
        for text in texts[:-1]:
            starts.append(starts[-1] + len(text) + 1)
        return self.picks("\n".join(texts), starts)

    def picks(self, joined: str, starts: Sequence[int]) -> set[int]:
        """The parts of ``joined`` (part k starts at ``starts[k]``) that hold a term found in
        few parts: at most a tenth of them, or ``_FEW``. A term in more picks nothing out
        (a path the call searched under, on every line)."""
        limit = max(_FEW, len(starts) // _SELECTIVE)
        found: set[int] = set()
        for term in self.terms:
            parts: set[int] = set()
            at = joined.find(term)
            while at >= 0:
                part = bisect_right(starts, at) - 1
                parts.add(part)
                if len(parts) > limit:
                    break
                following = starts[part + 1] if part + 1 < len(starts) else len(joined)
                at = joined.find(term, max(following, at + 1))
            else:
                found |= parts
        return found


def _measures(question: str) -> tuple[str, ...]:
    """What the question's number is counted in: the noun after "how many" (its plural
    too), time units after "how long" or "how often", sizes after "how big"."""
    found: list[str] = []
    for match in _HOW.finditer(question):
        how, noun = match.group(1).lower(), match.group(2)
        if how == "many" and noun:
            noun = noun.lower()
            found += [noun, noun[:-1] if noun.endswith("s") else noun + "s"]
        else:
            found += _UNITS.get(how, ())
    return tuple(dict.fromkeys(found))


def _operands(command: str) -> str:
    """What a shell command names, less the program, its subcommand, flags and output
    formats: ``python -m pytest -q tests/api`` names ``tests/api``, ``kubectl get pods -n
    prod -o json`` names ``pods prod``. A program's name is not what the agent asked about
    (``python`` is on every frame of a traceback)."""
    kept: list[str] = []
    for segment in _SEGMENT.split(command):
        tokens = segment.split()
        skip = 1  # the program
        if tokens and tokens[0].rsplit("/", 1)[-1] in _SUBCOMMANDS:
            skip = 2
        k = skip
        while k < len(tokens):
            token = tokens[k]
            if token in ("-m", "-c") and k + 1 < len(tokens):
                k += 2  # python -m pytest: the module is the program
                continue
            if token.startswith("-"):
                flag = token.split("=", 1)
                if flag[0] in _FORMAT_FLAGS and len(flag) == 1:
                    k += 1  # -o json: a format, not a subject
                k += 1
                continue
            kept.append(token.strip("'\""))
            k += 1
    return " ".join(kept)


def _terms(values: list[str]) -> tuple[str, ...]:
    found: set[str] = set()
    for value in values:
        value = value.strip()
        if _MIN_TERM <= len(value) <= 200:
            found.add(value)
        for token in _IDENTIFIER.findall(value):
            if len(token) >= _MIN_TERM or any(c in token for c in "_./"):
                found.add(token)
                found.update(part for part in token.split("/") if len(part) >= _MIN_TERM)
    return tuple(sorted(found))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, bool):
        return
    elif isinstance(value, (int, float)):
        yield str(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)
