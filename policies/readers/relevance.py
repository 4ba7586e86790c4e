"""How much a line or sentence has to do with what the agent asked.

Words are compared in one normal form on both sides: lowercase, identifiers split at
underscores, dots, dashes and case changes (``retryTimeoutMs`` is retry, timeout, ms), a
plural ``s`` dropped. ``Relevance`` weighs each of the query's words by how rare it is
among the texts being ranked (inverse document frequency), so that a word on every line
picks nothing out and a word on one line picks that line. Texts must not hold a newline.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence

__all__ = ["Relevance", "words"]

_CASE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_MIXED = re.compile(r"\b[A-Za-z][a-z0-9]*[A-Z][A-Za-z0-9]*\b")
_WORD = re.compile(r"[a-z][a-z0-9]*|\d+(?:\.\d+)?")


def words(text: str, *, skip: frozenset[str] = frozenset()) -> list[str]:
    """``text``'s words in normal form, in order (repeats kept), less those in ``skip``
    (compared before the plural is dropped). A word written in mixed case is also given
    whole (``FastAPI``: fast, api and fastapi), as a path or package writes it."""
    found = [_singular(w) for w in _WORD.findall(_CASE.sub(" ", text).lower()) if w not in skip]
    return found + [w.lower() for w in _MIXED.findall(text) if w.lower() not in skip]


def _singular(word: str) -> str:
    if len(word) <= 3 or not word.endswith("s") or word.endswith("ss"):
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"  # dependencies: dependency
    if word.endswith(("ches", "shes", "xes", "zes", "sses")):
        return word[:-2]  # matches: match, indexes: index
    return word[:-1]


# How code abbreviates common words: an identifier part ``max`` (``max_upload_mb``,
# ``maxRetries``) stands for a query's ``maximum``.
_ABBREVIATIONS = {
    "maximum": ("max",),
    "minimum": ("min",),
    "connection": ("conn",),
    "configuration": ("config", "cfg", "conf"),
    "database": ("db",),
    "message": ("msg",),
    "request": ("req",),
    "response": ("resp",),
    "error": ("err",),
    "environment": ("env",),
    "authentication": ("auth", "authn"),
    "authorization": ("auth", "authz"),
    "number": ("num",),
    "index": ("idx",),
    "length": ("len",),
    "address": ("addr",),
    "context": ("ctx",),
    "server": ("srv",),
    "service": ("svc",),
    "repository": ("repo",),
    "directory": ("dir",),
    "temporary": ("tmp", "temp"),
    "package": ("pkg",),
    "initialize": ("init",),
    "specification": ("spec",),
    "statistic": ("stat", "stats"),
    "millisecond": ("ms",),
    "second": ("sec", "secs"),
    "minute": ("min", "mins"),
    "megabyte": ("mb",),
    "gigabyte": ("gb",),
    "kilobyte": ("kb",),
    "timeout": ("ttl",),
    "count": ("cnt",),
    "previous": ("prev",),
    "buffer": ("buf",),
    "parameter": ("param",),
    "argument": ("arg",),
    "reference": ("ref",),
    "attribute": ("attr",),
    "document": ("doc",),
    "application": ("app",),
    "password": ("pwd", "passwd"),
}


class Relevance:
    """Scores texts by the rarity-weighted query words they hold, compared as whole words
    in normal form (``timeout`` is a word of ``RETRY_TIMEOUT_S``; ``defaults`` holds
    ``default`` and ``defaulted`` does not), or as the word's usual abbreviation (``max``
    in ``max_upload_mb`` for ``maximum``)."""

    __slots__ = ("_pattern", "_seen", "_wanted", "_weights")

    def __init__(self, query_words: Iterable[str], texts: Sequence[str]) -> None:
        # each accepted word (a query word or an abbreviation of one) -> the query word
        self._wanted: dict[str, str] = {}
        for word in query_words:
            self._wanted[word] = word
            for short in _ABBREVIATIONS.get(word, ()):
                self._wanted.setdefault(short, word)
        self._seen: dict[str, frozenset[str]] = {}  # text -> the query words it holds
        # Every written form of every accepted word, standing alone: one pass of C a text.
        forms = {form: word for accepted, word in self._wanted.items() for form in _forms(accepted)}
        self._wanted = forms
        alternatives = "|".join(sorted(map(re.escape, forms), key=len, reverse=True))
        self._pattern = (
            re.compile(rf"(?<![a-z0-9])(?:{alternatives})(?![a-z0-9])") if forms else None
        )
        lowered = "\n".join(texts).lower()
        starts = _starts(lowered)
        candidates: set[int] = set()  # lines holding a wanted word at least as a substring
        for word in self._wanted:
            candidates |= _lines_holding(lowered, starts, word)
        frequency: dict[str, int] = {}
        for line in candidates:
            for word in self._held(texts[line]):
                frequency[word] = frequency.get(word, 0) + 1
        n = len(texts) + 1
        self._weights = {
            word: math.log(n / f)
            for word, f in frequency.items()
            if f <= n // 2  # in most texts, a word picks nothing out
        }

    def __bool__(self) -> bool:
        return bool(self._weights)

    def score(self, text: str) -> float:
        """The sum of the weights of the query words ``text`` holds."""
        if not self._weights:
            return 0.0
        return sum(self._weights.get(word, 0.0) for word in self._held(text))

    def _held(self, text: str) -> frozenset[str]:
        """The query words ``text`` holds as words: in it with its case changes spaced out
        (``retryTimeout``), or whole (``FastAPI`` for ``fastapi``)."""
        held = self._seen.get(text)
        if held is None:
            if self._pattern is None:
                return frozenset()
            wanted = self._wanted
            lowered = f"{_CASE.sub(' ', text).lower()}\n{text.lower()}"
            held = self._seen[text] = frozenset(wanted[w] for w in self._pattern.findall(lowered))
        return held


def _forms(word: str) -> tuple[str, ...]:
    """``word`` (in normal form) as a text may write it: singular or plural."""
    if word[-1:].isdigit():
        return (word,)
    if word.endswith("y") and len(word) > 3:
        return word, word[:-1] + "ies", word + "s"
    if word.endswith(("ch", "sh", "x", "z", "ss")):
        return word, word + "es"
    return word, word + "s"


def _starts(text: str) -> list[int]:
    starts = [0]
    at = text.find("\n")
    while at >= 0:
        starts.append(at + 1)
        at = text.find("\n", at + 1)
    return starts


def _lines_holding(lowered: str, starts: list[int], word: str) -> set[int]:
    """The lines of ``lowered`` (each starting at ``starts``) that hold ``word``."""
    lines: set[int] = set()
    at = lowered.find(word)
    while at >= 0:
        line = bisect_right(starts, at) - 1
        lines.add(line)
        following = starts[line + 1] if line + 1 < len(starts) else len(lowered)
        at = lowered.find(word, following)
    return lines
