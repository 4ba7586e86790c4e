"""The fields of a JSON record collection: each key path's values across the records,
which records are unlike their siblings, and the collection's one-line summary.

A field is a key path from the record down (``status.phase``), through lists of objects
too (``status.containerStatuses[].state.waiting.reason``), to ``_MAX_DEPTH`` steps. A
record stands out by a key few siblings have (ALARM where it holds an error or a value
that reads as a failure), a rare value in a field of few values (ALARM where it reads as
a failure, or is a false ``ready``/``ok``), a failure that a quarter of the records or
fewer share, a note (``reason``, ``message``) most lack, a value of another kind, or a
numeric outlier.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from policies.readers._json_form import (
    EACH,
    ERROR_KEY,
    Route,
    key_kind,
    uninformative,
    value_key,
)
from policies.readers._ranking import few, outliers, reads_as_failure, value_counts
from policies.readers.pieces import Tier

__all__ = ["Field", "Profile", "Standout", "profile", "standouts", "summary"]

_MAX_DEPTH = 6  # steps of a route: status, containerStatuses, [], state, waiting, reason
_MAX_ITEMS = 20  # items of a record's list looked into
_MIN_SIBLINGS = 5  # fewer records are too few to say that one is unlike the others
_MAX_LOW_CARDINALITY = 8
_ALARM_SHARE = 4  # a failure in at most 1/4 of the records picks them out
_MAX_KEYS_SHOWN = 6  # every token of the summary is taken from the records
_MAX_STATS = 4
_MAX_SUMMARY = 160  # characters: fields are described, most telling first, while they fit
_MAX_COUNTED = 3  # numbers of more values show their range, not their counts
_MAX_SEARCHED = 2000  # characters of a record's values searched for the question's words

_NOTE_KEY = re.compile(r"^(?:reason|message|msg|warning|warnings)$", re.IGNORECASE)
_GOOD_FLAG = re.compile(r"^(?:ok|success|succeeded|passed|healthy|ready|valid)$", re.IGNORECASE)
_DATE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?$"
)
_KINDS: dict[type, type] = {float: int}  # ints and floats are one kind of value


@dataclass(slots=True)
class Field:
    """One key path across the records of a collection."""

    path: str
    route: Route  # the keys from the record down: ("status", "phase")
    parent: Field | None
    present: list[int] = field(default_factory=list)  # records that hold the key, once each
    filled: list[int] = field(default_factory=list)  # ... with a non-empty value
    scalars: list[tuple[int, Any]] = field(default_factory=list)
    children: dict[str, Field] = field(default_factory=dict)
    # Filled in by finish(), once every record is seen:
    keys: list[str] = field(default_factory=list)  # each scalar as counted: "true", "3"
    counts: Counter[str] = field(default_factory=Counter)
    kinds: Counter[type] = field(default_factory=Counter)
    numbers: list[tuple[int, float]] = field(default_factory=list)
    opaque: bool = False  # most values are urls or hashes

    def finish(self, opaque: dict[str, bool]) -> None:
        values = [v for _, v in self.scalars]
        self.keys = [v if type(v) is str else value_key(v) for v in values]
        self.counts = Counter(self.keys)
        self.kinds = Counter(map(type, values))
        if float in self.kinds:
            self.kinds[int] += self.kinds.pop(float)
        if self.kinds.get(int, 0) * 5 >= 4 * len(values):
            self.numbers = [(i, x) for i, v in self.scalars if (x := _number(v)) is not None]
        if str in self.kinds:
            sample = [v for v in values[:20] if type(v) is str]
            self.opaque = sum(opaque.get(v, False) for v in sample) * 2 > len(sample)


@dataclass(slots=True)
class Profile:
    """The fields of a collection (in order of first appearance) and, per record, the text
    of its values that read (not urls or hashes), to search for the question's words."""

    fields: dict[str, Field]
    searched: list[str]
    num_records: int
    opaque: dict[str, bool]  # whether each long string without spaces is a url or a hash

    def common(self) -> set[Route]:
        """The routes whose one value every record shares."""
        n = self.num_records
        return {
            f.route
            for f in self.fields.values()
            if len(f.counts) == 1 and len(f.present) == n and len(f.scalars) >= n
        }


def profile(records: list[Any]) -> Profile:
    """The fields of ``records``, each record's values read, in one pass over them."""
    fields: dict[str, Field] = {}
    top: dict[str, Field] = {}
    searched = []
    opaque: dict[str, bool] = {}
    for index, record in enumerate(records):
        texts: list[str] = []
        if isinstance(record, dict):
            _profile_object(record, None, top, index, fields, texts, opaque)
        searched.append(" ".join(texts)[:_MAX_SEARCHED].replace("\n", " "))
    for f in fields.values():
        f.finish(opaque)
    return Profile(fields, searched, len(records), opaque)


def _profile_object(
    obj: dict[str, Any],
    parent: Field | None,
    children: dict[str, Field],
    index: int,
    fields: dict[str, Field],
    texts: list[str],
    opaque: dict[str, bool],
) -> None:
    for key, value in obj.items():
        f = children.get(key)
        if f is None:
            route = (*parent.route, key) if parent is not None else (key,)
            path = f"{parent.path}.{key}" if parent is not None else str(key)
            f = children[key] = fields[path] = Field(path, route, parent)
        present = f.present  # each record once, however many list items hold the key
        if not present or present[-1] != index:
            present.append(index)
        if value and (not f.filled or f.filled[-1] != index):  # 0, "", null, [] are empty
            f.filled.append(index)
        kind = type(value)
        if kind is dict:
            if len(f.route) < _MAX_DEPTH:
                _profile_object(value, f, f.children, index, fields, texts, opaque)
        elif kind is list:
            if value and type(value[0]) is dict and len(f.route) < _MAX_DEPTH - 1:
                each = f.children.get(EACH)
                if each is None:
                    each = f.children[EACH] = Field(f.path + EACH, (*f.route, EACH), f)
                    fields[each.path] = each
                for item in value[:_MAX_ITEMS]:
                    if type(item) is dict:
                        _mark(each, index, bool(item))
                        _profile_object(item, each, each.children, index, fields, texts, opaque)
        else:
            f.scalars.append((index, value))
            if kind is str:
                if len(value) < 16 or " " in value:
                    texts.append(value)
                    continue
                said = opaque.get(value)
                if said is None:
                    said = opaque[value] = uninformative(value)
                if not said:
                    texts.append(value)


def _mark(f: Field, index: int, filled: bool) -> None:
    if not f.present or f.present[-1] != index:
        f.present.append(index)
    if filled and (not f.filled or f.filled[-1] != index):
        f.filled.append(index)


# -- records unlike their siblings ---------------------------------------------------------


_Note = Callable[[int, Tier, int, Route, "str | None"], None]


@dataclass(slots=True)
class Standout:
    tier: Tier
    rarity: int  # how many records share what makes this one stand out; fewer first
    # The keys that make it, each with the values that do (None: any value it holds).
    routes: dict[Route, set[str] | None] = field(default_factory=dict)
    alarms: set[Route] = field(default_factory=set)  # those that read as a failure


def standouts(fields: dict[str, Field], n: int) -> dict[int, Standout]:
    """Records unlike their siblings, by index."""
    found: dict[int, Standout] = {}

    def note(index: int, tier: Tier, rarity: int, route: Route, key: str | None) -> None:
        old = found.get(index)
        if old is None:
            old = found[index] = Standout(tier, rarity, {route: None if key is None else {key}})
        else:
            keys = old.routes.get(route, set())
            if keys is not None:
                old.routes[route] = None if key is None else keys | {key}
            if (tier, rarity) < (old.tier, old.rarity):
                old.tier, old.rarity = tier, rarity
        if tier == Tier.ALARM:
            old.alarms.add(route)

    if n < _MIN_SIBLINGS:
        return found
    rare_count = few(n)
    rare_keys: set[str] = set()
    for f in fields.values():
        route, name = f.route, str(f.route[-1])
        parent = f.parent
        if len(f.present) <= rare_count and (parent is None or len(parent.present) > rare_count):
            rare_keys.add(f.path)
            tier = Tier.ALARM if ERROR_KEY.search(name) and f.filled else Tier.STANDOUT
            for index in f.present:
                note(index, tier, len(f.present), route, None)
        if (ERROR_KEY.search(name) or _NOTE_KEY.match(name)) and 0 < len(f.filled) * 2 <= n:
            tier = Tier.ALARM if ERROR_KEY.search(name) else Tier.STANDOUT
            for index in f.filled:
                note(index, tier, len(f.filled), route, None)
        _alarms_under_rare_keys(f, rare_keys, note)
        if len(f.scalars) < _MIN_SIBLINGS:
            continue
        kinds = f.kinds
        if len(kinds) > 1:  # a null or a string where the others hold numbers
            for (index, value), key in zip(f.scalars, f.keys, strict=True):
                count = kinds[_KINDS.get(type(value), type(value))]
                if count <= rare_count:
                    note(index, Tier.STANDOUT, count, route, key)
        _rare_values(f, rare_count, note)
        if len(f.numbers) >= 8:
            far = outliers([x for _, x in f.numbers])
            for (index, value), key in zip(f.scalars, f.keys, strict=True):
                if _number(value) in far:
                    note(index, Tier.STANDOUT, len(far), route, key)
    return found


def _alarms_under_rare_keys(f: Field, rare_keys: set[str], note: _Note) -> None:
    """A failure under a key few records have (``state.waiting.reason: CrashLoopBackOff``)."""
    ancestor: Field | None = f
    while ancestor is not None and ancestor.path not in rare_keys:
        ancestor = ancestor.parent
    if ancestor is None:
        return
    for index, value in f.scalars:
        if type(value) is str and reads_as_failure(value):
            note(index, Tier.ALARM, len(ancestor.present), f.route, value)


def _rare_values(f: Field, rare_count: int, note: _Note) -> None:
    """A value few records share in a field of few values, and a failure a quarter of them
    or fewer share where the usual value is none."""
    counts, name = f.counts, str(f.route[-1])
    low_cardinality = 2 <= len(counts) <= _MAX_LOW_CARDINALITY and len(counts) * 3 <= len(f.scalars)
    failing = {key for key in counts if reads_as_failure(key)}
    # Failures that are usual here pick nothing out; a rare one still does.
    picked = failing if sum(counts[key] for key in failing) * _ALARM_SHARE <= len(f.scalars) else ()
    good_flag = _GOOD_FLAG.match(name) is not None
    for (index, value), key in zip(f.scalars, f.keys, strict=True):
        rare = low_cardinality and counts[key] <= rare_count
        if not rare and key not in picked:
            continue
        alarm = key in failing if isinstance(value, str) else (value is False and good_flag)
        note(index, Tier.ALARM if alarm else Tier.STANDOUT, counts[key], f.route, key)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        x = float(value)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


# -- the summary line ------------------------------------------------------------------


def summary(label: str, n: int, fields: dict[str, Field]) -> str:
    """``[array "data": 500 records; keys id, amount, status, +9 more; status succeeded
    497, failed 3; amount 120-2500000]``: the keys that tell most about a record, and the
    fields that tell most about the collection while the line is short, in document order."""
    parts = [f"{label}: {n} records"]
    top = [f for f in fields.values() if len(f.route) == 1]
    if top:
        identity = next((f.path for f in top if key_kind(f.path) == "id"), None)
        if "id" in fields:
            identity = "id"
        ranked = sorted(top, key=lambda f: _key_rank(f, identity))
        chosen_keys = {f.path for f in ranked[:_MAX_KEYS_SHOWN]}
        shown = [f for f in top if f.path in chosen_keys]
        keys = [f.path if len(f.present) == n else f"{f.path} ({len(f.present)})" for f in shown]
        more = f", +{len(top) - len(shown)} more" if len(top) > len(shown) else ""
        parts.append("keys " + ", ".join(keys) + more)
    stats = []
    for order, f in enumerate(fields.values()):
        described = _describe(f, n)
        if described is not None:
            text, telling = described
            stats.append((telling, len(f.route), order, text))
    room = _MAX_SUMMARY - sum(len(part) + 2 for part in parts)
    chosen: list[tuple[int, int, int, str]] = []
    for stat in sorted(stats):
        if len(chosen) == _MAX_STATS:
            break
        if len(stat[-1]) + 2 > room and chosen:
            break  # a less telling one that is shorter would not say more
        chosen.append(stat)
        room -= len(stat[-1]) + 2
    parts.extend(text for *_, text in sorted(chosen, key=lambda s: s[2]))
    return "[" + "; ".join(parts) + "]"


def _key_rank(f: Field, identity: str | None) -> int:
    """The record's identity, name and state first, then other values, then objects, then
    urls, hashes and other objects' ids."""
    kind = key_kind(f.path)
    if f.path == identity or kind in ("state", "name"):
        return 0
    if kind == "id" or f.opaque:
        return 3
    return 2 if f.children else 1


def _describe(f: Field, n: int) -> tuple[str, int] | None:
    """A field's range or value counts, and how little it tells (0: a rare value or a
    failure beside a usual one, 1: a range of numbers, 2: a few values, 3: a range of
    dates, 4: of ids, or one value); None for names, text, urls and hashes."""
    num_nulls = f.kinds.get(type(None), 0)
    if len(f.scalars) - num_nulls < 2 or f.opaque:
        return None
    numbers = [x for _, x in f.numbers]
    counts = f.counts
    if numbers and len(numbers) + num_nulls == len(f.scalars) and len(counts) > _MAX_COUNTED:
        low, high = min(numbers), max(numbers)
        decimals = 0 if all(type(v) is int for _, v in f.scalars if v is not None) else 2
        sep = ".." if low < 0 else "-"
        telling = 4 if key_kind(str(f.route[-1])) == "id" or low == high else 1
        return f"{f.path} {_format(low, decimals)}{sep}{_format(high, decimals)}", telling
    if f.kinds.get(str, 0) + num_nulls == len(f.scalars):
        dates = [v for _, v in f.scalars if v is not None]
        if all(_DATE.match(v) for v in dates):
            low, high = min(dates), max(dates)
            if low[:10] != high[:10]:
                low, high = low[:10], high[:10]
            elif len(high) > 11:
                high = high[11:]  # the same day: the time alone
            return f"{f.path} {low}..{high}", 3 if low != high else 4
    if len(counts) == 1:
        return f"{f.path} {value_counts(counts, n)}", 4
    if len(counts) > _MAX_LOW_CARDINALITY or len(counts) * 3 > len(f.scalars):
        return None  # names, text: values of their own
    usual = counts.most_common(1)[0][1] * 2 >= len(f.scalars)
    rare = min(counts.values()) <= few(n) or any(reads_as_failure(key) for key in counts)
    return f"{f.path} {value_counts(counts, n)}", 0 if usual and rare else 2


def _format(x: float, decimals: int) -> str:
    if decimals == 0 or abs(x) >= 1e9:
        return f"{x:.0f}" if abs(x) < 1e15 else f"{x:.3g}"
    return f"{x:.2f}" if abs(x) >= 0.01 or x == 0 else f"{x:.3g}"
