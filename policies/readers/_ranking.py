"""What the record and table readers rank by: what the call names, and what stands out.

A row or record is asked for when it holds a selective term of the call's arguments or an
identifier the question names (``order 48213377``, ``ana@example.com``), or the most
of the question's rare words in any inflection ("failing" finds ``failed``). It stands out
when a value is rare among its siblings' (ALARM when it reads as a failure) or
a number lies far from the others.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from policies.readers._quantities import bounds
from policies.readers.pieces import Query
from policies.readers.relevance import Relevance, words

__all__ = [
    "asked",
    "call_terms",
    "few",
    "mentions_failure",
    "outliers",
    "reads_as_failure",
    "selective",
    "value_counts",
]

# Words of failure, matched in lowercased text (a case-blind pattern is several times slower).
_FAILURE = re.compile(
    r"fail|error|exception|crash|fatal|panic|denied|refused|rejected|timed?.?out|"
    r"killed|oom|unhealthy|invalid|abort|backoff|unreachable|unavailable|reset by peer|"
    r"critical|declined|expired|exited \([1-9]"
)
_MAX_STATE = 200  # a longer value is prose, not a state that reads as a failure
_OUTLIER_Z = 6.0
_MAX_COMMON = 3  # values a summary names besides the rare ones
_MAX_VALUES = 5
_FEW_SHARE = 20  # a value in at most 1/20 of the siblings (and at least one) is rare
_MIN_TERM = 4
# An identifier in the question: with a digit (an order number, a request id), or joined by
# ``_ @ - . / :`` between word characters (``cus_8Hq2``, ``billing-eu-prod``, ``a@b.io``).
_QUESTION_TOKEN = re.compile(r"[\w@./:\-]*\w")
_JOINED = re.compile(r"\w[_@./:\-]\w")
_PATH = re.compile(r"(?:~|\.{0,2})/[\w.@+\-]+(?:/[\w.@+\-]+)+$")  # /srv/reports/2024.csv
_BOUND_KEY = re.compile(
    r"(?:^|[\[_.])(?:gte?|lte?|since|until|after|before|limit|offset|page|per_page|page_size|"
    r"min|max)\]?$",
    re.IGNORECASE,
)
_ACRONYM = re.compile(r"\b[A-Z]{3}\b")
# A question word so ended (its stem this long) is looked for in its other forms too.
_SUFFIXES = (("ing", 3), ("ed", 4), ("ure", 4), ("e", 5))
_INFLECTIONS = ("", "e", "ed", "ing", "ure")


def reads_as_failure(value: str) -> bool:
    """Whether a short value reads as a failure: ``failed``, ``CrashLoopBackOff``,
    ``Exited (137) 2 hours ago``; a longer one is prose."""
    return len(value) <= _MAX_STATE and _FAILURE.search(value.lower()) is not None


def mentions_failure(text: str) -> bool:
    """Whether a line of any length names a failure."""
    return _FAILURE.search(text.lower()) is not None


def few(num_siblings: int) -> int:
    """How many siblings may share a value that is rare among them."""
    return max(1, num_siblings // _FEW_SHARE)


def value_counts(counts: Counter[str], num_siblings: int) -> str:
    """The most common values and the rare ones, with their counts, for a summary line:
    ``done 90, running 20, queued 11, failed 1, +2 more``."""
    ordered = counts.most_common()
    rare_count = few(num_siblings)
    shown = ordered[:_MAX_COMMON] + [vc for vc in ordered[_MAX_COMMON:] if vc[1] <= rare_count]
    shown = shown[:_MAX_VALUES]
    text = ", ".join(f"{_clip(value, 30)} {count}" for value, count in shown)
    return text + (f", +{len(counts) - len(shown)} more" if len(counts) > len(shown) else "")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_terms(query: Query, skip: Collection[str] = ()) -> list[str]:
    """The terms to find in the rows or records of a file or a listing: the call's and the
    question's, less the folders of a path the call read (``/srv/reports/x.csv`` names
    where the file is, not a row holding "reports"), the bounds and pages of a query
    (``created[gte]``, ``since``, ``limit``: a range, not a name), the numbers of the
    question's thresholds, and those in ``skip``."""
    places, ranges = _not_asked(query)
    left_out = {*skip, *places, *bounds(query.question)}
    terms = dict.fromkeys((*query.terms, *_question_terms(query)))
    return [
        term
        for term in terms
        if term not in left_out and not any(term in value for value in ranges)
    ]


def _not_asked(query: Query) -> tuple[set[str], list[str]]:
    """The folders of the paths the call read, and the values of its bounds and pages."""
    places: set[str] = set()
    ranges: list[str] = []  # a bound's value and the identifiers in it: 2026-01-01T00:00:00Z
    for key, value in _arguments(query.arguments or {}, ""):
        if _BOUND_KEY.search(key):
            ranges.append(value)
        elif _PATH.match(value):
            places.update(value.strip("/").split("/")[:-1])
    return places, ranges


def _arguments(value: Any, key: str) -> Iterator[tuple[str, str]]:
    """Each string or number of the arguments with the key it is under."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield key, str(value)
    elif isinstance(value, Mapping):
        for name, item in value.items():
            yield from _arguments(item, str(name))
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _arguments(item, key)


def _question_terms(query: Query) -> tuple[str, ...]:
    """Identifiers the question names, to find verbatim as the call's terms are; not the
    numbers of its thresholds ("over 500")."""
    found: list[str] = []
    skip = bounds(query.question)
    for token in _QUESTION_TOKEN.findall(query.question):
        token = token.strip("./:-")
        if len(token) < _MIN_TERM or token in found or token in skip:
            continue
        if any(c.isdigit() for c in token) or _JOINED.search(token):
            found.append(token)
    return tuple(found)


def asked(
    query: Query,
    texts: Sequence[str],
    *,
    words_in: Sequence[str] | None = None,
    skip: Collection[str] = (),
    picked: Mapping[str, Sequence[int]] | None = None,
) -> list[float]:
    """How much each text has to do with the call: 10 for each selective term it holds
    (a term of the arguments or an identifier of the question; ``picked`` where the caller
    found them), then the weight of the query's rare words it holds, in ``words_in`` where
    given (the text less its urls and hashes). Terms and words of ``skip`` (a table's
    column names), of the folders the call read and of its bounds pick nothing out."""
    if picked is None:
        picked = selective(call_terms(query, skip), texts)
    scores = [0.0] * len(texts)
    for hits in picked.values():
        for i in hits:
            scores[i] += 10.0
    places, ranges = _not_asked(query)
    content = _content_words(query, {w for name in (*skip, *places, *ranges) for w in words(name)})
    if content:
        searched = texts if words_in is None else words_in
        relevance = Relevance(content, searched)
        least = math.log(max(2.0, min(10.0, (len(searched) + 1) / 2)))
        for i, text in enumerate(searched if relevance else ()):
            score = relevance.score(text)
            if score >= least:
                scores[i] += score
    return scores


def _content_words(query: Query, skip: set[str]) -> list[str]:
    """The query's content words, and the inflections of the question's: "errored" also
    finds ``error``, "failing" ``failed`` and ``failure``, "upgrade" ``upgrading``."""
    found: dict[str, None] = {}
    in_question = set(words(query.question))
    acronyms = {w.lower() for w in _ACRONYM.findall(query.question)}  # "API", "CPU": words
    for word in sorted(query.words):
        if (len(word) < 4 and word not in acronyms) or not word.isalpha() or word in skip:
            continue
        found[word] = None
        if word not in in_question:
            continue
        for suffix, shortest_stem in _SUFFIXES:
            stem = word.removesuffix(suffix)
            if stem != word and len(stem) >= shortest_stem:
                found.update((form, None) for e in _INFLECTIONS if len(form := stem + e) >= 4)
                break
    return list(found)


def selective(terms: Sequence[str], texts: Sequence[str]) -> dict[str, list[int]]:
    """The terms that pick texts out, with the texts each picks: a term is selective as in
    ``Query.picks`` (in at most a tenth of the texts, or ten) and in at most half of them.
    Where a term stands alone in some texts (``web-1``), its hits inside a longer word
    (``web-12``) are other names."""
    found: dict[str, list[int]] = {}
    limit = min(max(10, len(texts) // 10), len(texts) // 2)
    for term in terms:
        hits = [i for i, text in enumerate(texts) if term in text]
        if hits:
            hits = [i for i in hits if _alone(term, texts[i])] or hits
        if 0 < len(hits) <= limit:
            found[term] = hits
    return found


def _alone(term: str, text: str) -> bool:
    """Whether ``term`` stands in ``text`` between characters that are not a word's."""
    at = text.find(term)
    while at >= 0:
        end = at + len(term)
        before = text[at - 1] if at else " "
        after = text[end] if end < len(text) else " "
        if not (before.isalnum() or before == "_" or after.isalnum() or after == "_"):
            return True
        at = text.find(term, at + 1)
    return False


def outliers(values: Sequence[float]) -> set[float]:
    """Values whose robust z-score (median and MAD) passes _OUTLIER_Z."""
    ordered = sorted(values)
    median = ordered[len(ordered) // 2]
    deviations = sorted(abs(x - median) for x in values)
    scale = 1.4826 * deviations[len(deviations) // 2]
    if scale == 0:  # most values equal: the mean deviation still sees a lone outlier
        scale = 1.2533 * sum(deviations) / len(deviations)
    if scale == 0:
        return set()
    return {x for x in values if abs(x - median) / scale > _OUTLIER_Z}
