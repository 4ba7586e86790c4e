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
from collections.abc import Iterable, Sequence

__all__ = ["Relevance", "words"]

_CASE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD = re.compile(r"[a-z][a-z0-9]*|\d+(?:\.\d+)?")


def words(text: str, *, skip: frozenset[str] = frozenset()) -> list[str]:
    """``text``'s words in normal form, in order (repeats kept), less those in ``skip``
    (compared before the plural is dropped)."""
    found = _WORD.findall(_CASE.sub(" ", text).lower())
    return [_singular(w) for w in found if w not in skip]


def _singular(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


class Relevance:
    """Scores texts by the rarity-weighted query words they hold. A word is found as a
    substring of the lowercased text, so that ``timeout`` finds ``RETRY_TIMEOUT_S``."""

    __slots__ = ("_weights",)

    def __init__(self, query_words: Iterable[str], texts: Sequence[str]) -> None:
        joined = "\n".join(texts).lower()
        n = len(texts) + 1
        self._weights: dict[str, float] = {}
        for word in query_words:
            frequency = _lines_holding(joined, word)
            if frequency and frequency <= n // 2:  # in most texts, a word picks nothing out
                self._weights[word] = math.log(n / frequency)

    def __bool__(self) -> bool:
        return bool(self._weights)

    def score(self, text: str) -> float:
        """The sum of the weights of the query words ``text`` holds."""
        if not self._weights:
            return 0.0
        lowered = text.lower()
        return sum(weight for word, weight in self._weights.items() if word in lowered)


def _lines_holding(joined: str, word: str) -> int:
    """How many lines of ``joined`` hold ``word``, each counted once."""
    count = 0
    at = joined.find(word)
    while at >= 0:
        count += 1
        end = joined.find("\n", at)
        if end < 0:
            break
        at = joined.find(word, end)
    return count
