"""Quantities in table cells and thresholds in questions, compared in one base per kind.

A cell's quantity is its number times its unit's factor (``7.8G`` is 7.8 * 1024**3 bytes,
``3d4h`` is seconds, ``97%`` a percentage); a column named in percent (``mem_used_pct``,
``Use%``) holds percentages. ``12,50`` holds a decimal comma where its column writes them
so (a group of other than three digits after the comma). A threshold ("above 90% disk",
"5 restarts or more", "an alert at 90%: which crossed it?") is met by the values of its
kind in the columns its words name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from policies.readers.pieces import Query
from policies.readers.relevance import words

__all__ = [
    "Quantity",
    "Threshold",
    "bounds",
    "decimal_commas",
    "percent_name",
    "quantity",
    "thresholds",
]

_QUANTITY = re.compile(
    r"([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+) ?([A-Za-zµ%]+)?(?: \(.*\))?$"
)
_DECIMAL_COMMA = re.compile(r"[-+]?\d+,\d+ ?([A-Za-zµ%]+)?$")
_ODD_GROUP = re.compile(r"\d{4,},|,(?:\d{1,2}|\d{4,})(?!\d)")  # not a thousands separator
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+(?:\.\d+)?)s)?$")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+$")
_NUMBER = r"(?P<num>[-+]?\d+(?:[.,]\d+)?)\s?(?P<unit>%|[A-Za-zµ]+\b)?"
_THRESHOLD = re.compile(
    r"(?P<op>>=|<=|≥|≤|>|<|\b(?:above|over|exceed(?:s|ing)?|more than|greater than|"
    r"higher than|larger than|bigger than|at least|no less than|at or above|at or over|"
    r"below|under|less than|fewer than|lower than|smaller than|at most|no more than|"
    r"at or below|at or under)\b)\s*" + _NUMBER + "|"
    r"\b" + _NUMBER.replace("num>", "num2>").replace("unit>", "unit2>") + r"\s*(?:\w+\s+)?"
    r"(?P<op2>or (?:more|higher|above|greater|over|less|lower|below|fewer|under))\b",
    re.IGNORECASE,
)
# A mark values crossed: "an alert at 90%", "a budget of 500 ms", with a verb that says so.
_MARK = re.compile(r"\b(?:at|of)\s+(?P<num>[-+]?\d+(?:[.,]\d+)?)\s?(?P<unit>%|[A-Za-zµ]+\b)")
_CROSSED = re.compile(
    r"\b(?:cross|exceed|breach|pass|reach)(?:es|ed|ing|s)?\b|\b(?:went|gone) over\b",
    re.IGNORECASE,
)
_PERCENT_WORDS = frozenset(("pct", "percent", "percentage", "perc"))


def _units() -> dict[str, tuple[str, float]]:
    """unit -> (kind, factor): values of one kind compare once multiplied by their factor.
    Sizes count in 1024s whatever their spelling (df's ``G``, kubectl's ``Gi``, "2 GB")."""
    units = {"": ("", 1.0), "%": ("%", 1.0), "percent": ("%", 1.0), "pct": ("%", 1.0)}
    for names, factor in (
        (("ns",), 1e-9),
        (("us", "µs"), 1e-6),
        (("ms",), 1e-3),
        (("s", "sec", "secs", "second", "seconds"), 1.0),
        (("m", "min", "mins", "minute", "minutes"), 60.0),
        (("h", "hr", "hrs", "hour", "hours"), 3600.0),
        (("d", "day", "days"), 86400.0),
        (("w", "week", "weeks"), 604800.0),
    ):
        units.update((name, ("time", factor)) for name in names)
    units.update({"B": ("size", 1.0), "bytes": ("size", 1.0), "k": ("size", 1024.0)})
    for power, prefix in enumerate("KMGTP", start=1):
        for name in (prefix, prefix + "B", prefix + "iB", prefix + "i", prefix.lower() + "B"):
            units[name] = ("size", 1024.0**power)
    return units


_UNITS = _units()


class Quantity(NamedTuple):
    value: float  # in the unit's base: seconds, bytes, percent
    kind: str  # "", "%", "time", "size", or an unknown unit's name


def quantity(cell: str, *, decimal_comma: bool = False) -> Quantity | None:
    """The cell's number in its unit's base, or None when it is not one number."""
    if cell[:1].isdigit() and cell[-1].isdigit():
        try:
            value = float(cell)
        except ValueError:  # 1,234 or 1.2.3 or 10:00
            pass
        else:
            return Quantity(value, "") if math.isfinite(value) else None
    if decimal_comma and (m := _DECIMAL_COMMA.match(cell)) is not None:
        number, unit = cell[: m.start(1) if m.group(1) else len(cell)].strip(), m.group(1) or ""
        return Quantity(float(number.replace(",", ".")) * _unit(unit)[1], _unit(unit)[0])
    m = _QUANTITY.match(cell)
    if m is not None:
        number, unit = m.group(1), m.group(2) or ""
        kind, factor = _unit(unit)
        return Quantity(float(number.replace(",", "")) * factor, kind)
    if cell and cell[-1] in "dhms" and cell[0].isdigit():
        d = _DURATION.match(cell)  # kubectl's AGE: 3d4h, 5m20s
        if d is not None and any(d.groups()):
            days, hours, minutes, seconds = (float(g) if g else 0.0 for g in d.groups())
            return Quantity(((days * 24 + hours) * 60 + minutes) * 60 + seconds, "time")
    return None


def _unit(unit: str) -> tuple[str, float]:
    return _UNITS.get(unit) or _UNITS.get(unit.lower()) or (unit.lower(), 1.0)


def decimal_commas(cells: list[str]) -> bool:
    """Whether a column writes decimal commas: its numbers hold a comma, and some comma is
    not a thousands separator (``12,50``, ``0,5``)."""
    with_comma = [cell for cell in cells if "," in cell and _DECIMAL_COMMA.match(cell)]
    return len(with_comma) * 2 >= len(cells) > 0 and any(_ODD_GROUP.search(c) for c in with_comma)


def percent_name(name: str) -> bool:
    """Whether a column's name says it holds percentages: ``Use%``, ``mem_used_pct``."""
    return "%" in name or any(w in _PERCENT_WORDS for w in words(name))


@dataclass(frozen=True, slots=True)
class Threshold:
    op: str  # ">", ">=", "<", "<="
    value: float
    kind: str
    near: frozenset[str]  # the words just before it and its unit word: "cpu", "restarts"

    def names(self, column: str) -> bool:
        """Whether a word near the threshold is the column's name or starts like it
        ("available" names ``Avail``)."""
        return any(
            w == near or (len(w) >= 3 and near.startswith(w))
            for w in words(column)
            for near in self.near
        )

    def met(self, x: float) -> bool:
        if self.op == ">":
            return x > self.value
        if self.op == ">=":
            return x >= self.value
        if self.op == "<":
            return x < self.value
        return x <= self.value


_OPS = {
    ">": ">",
    "≥": ">=",
    ">=": ">=",
    "<": "<",
    "≤": "<=",
    "<=": "<=",
    "at least": ">=",
    "no less than": ">=",
    "at or above": ">=",
    "at or over": ">=",
    "at most": "<=",
    "no more than": "<=",
    "at or below": "<=",
    "at or under": "<=",
}
_BELOW = ("below", "under", "less than", "fewer than", "lower than", "smaller than")
_OR_LESS = ("or less", "or lower", "or below", "or fewer", "or under")


def thresholds(query: Query) -> list[Threshold]:
    """The thresholds of the question and the arguments, each with the words that name
    what it bounds: "cpu above 90%", "less than 10 GB available", "5 restarts or more",
    and a mark that values crossed: "an alert at 90%: which hosts crossed it?"."""
    found = []
    for text in (query.question, *_strings(query.arguments or {})):
        for m in _THRESHOLD.finditer(text):
            postfix = m.group("op2") is not None
            phrase = " ".join(m.group("op2" if postfix else "op").lower().split())
            if postfix:
                op = "<=" if phrase in _OR_LESS else ">="
            else:
                op = _OPS.get(phrase) or ("<" if phrase in _BELOW else ">")
            number = "num2" if postfix else "num"
            found.append(_threshold(text, m, op, number, "unit2" if postfix else "unit"))
        if not found and _CROSSED.search(text):
            found.extend(_threshold(text, m, ">=", "num", "unit") for m in _MARK.finditer(text))
    return found[:8]


def _threshold(text: str, m: re.Match[str], op: str, number: str, unit: str) -> Threshold:
    known = _UNITS.get(m.group(unit) or "") or _UNITS.get((m.group(unit) or "").lower())
    kind, factor = known if known is not None else ("", 1.0)
    # The words around it name the column: "cpu above 90%", "10 GB available".
    near = set(words(text[max(0, m.start() - 40) : m.start()])[-3:])
    near.update(words(text[m.end(number) : m.end(number) + 30])[:2])
    digits = m.group(number)
    value = float(digits.replace(",", "" if _THOUSANDS.match(digits) else "."))
    return Threshold(op, value * factor, kind, frozenset(near))


def bounds(text: str) -> set[str]:
    """The numbers of the thresholds in ``text``: bounds, not names ("over 500")."""
    found = {m.group("num") or m.group("num2") for m in _THRESHOLD.finditer(text)}
    if _CROSSED.search(text):
        found.update(m.group("num") for m in _MARK.finditer(text))
    return found


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)
