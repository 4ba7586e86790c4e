"""JSON documents and JSON lines: the envelope, a summary per record collection, records.

A record collection is an array of objects (or an object of objects, keyed by name) that
is not inside another collection; JSON lines, and a stream of documents as jq prints
them, are one collection. Each record is one compact line, its nested values elided past
a few hundred characters unless they hold an asked-for term. The envelope (the document
with each collection replaced by a marker naming its path and length) and one line of
counts and ranges per collection come first; then the records the call names (a term, or
a rare word of the question), then those unlike their siblings (a rare value, ALARM where
it reads as a failure; an error key the others lack, ALARM; a numeric outlier; a rare
key), then the first record, which shows the shape, then the rest in order. A document
without collections that is too long for one line becomes ``path: value`` lines.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from policies.readers.pieces import Piece, Query, Reading, Tier
from policies.readers.relevance import Relevance

__all__ = ["read_json"]

_MAX_RECORD = 400  # characters of one rendered record before nested values are elided
_MAX_NESTED = 80  # a nested value this short stays in an elided record
_MARKER_ROOM = 80  # characters past _MAX_RECORD that markers of left-out values may take
_MAX_STRING = 160  # a string longer than this is cut in an elided record or a path line
_MAX_ENVELOPE = 400  # a longer envelope becomes path lines
_MAX_LINE_VALUE = 100  # a container this short is one path line
_MIN_ARRAY = 3  # a shorter array of objects stays in the envelope
_MIN_KEYED = 8  # an object of objects needs this many to be a collection
_MIN_SIBLINGS = 5  # fewer records are too few to say that one is unlike the others
_MAX_DEPTH = 3  # nested keys profiled per record: "status.container.state"
_MAX_LOW_CARDINALITY = 8
_OUTLIER_Z = 6.0
_MAX_TRAILER_LINES = 3  # lines after a document kept as its footer ("HTTP 200")
_MAX_STATS = 6
_MAX_COUNTED = 3  # numbers of more values show their range, not their counts
_MAX_KEYS_SHOWN = 12

_DECODER = json.JSONDecoder()
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": "))  # one record a line
_NONBLANK = re.compile(r"\S")
_SENTINEL = re.compile('"\ue000(\\d+)\ue000"')
_DATE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?$"
)
_PLAIN_KEY = re.compile(r"[\w\-@$/:]+$")
_ERROR_KEY = re.compile(r"(?:^|_)(?:errors?|exception|failure|fault|err)(?:$|_)", re.IGNORECASE)
_NOTE_KEY = re.compile(r"^(?:reason|message|msg|warning|warnings)$", re.IGNORECASE)
_ALARM_VALUE = re.compile(
    r"fail|error|exception|crash|fatal|panic|denied|refused|rejected|timed?.?out|"
    r"killed|oom|unhealthy|invalid|abort|backoff|unreachable|critical",
    re.IGNORECASE,
)
_GOOD_FLAG = re.compile(r"^(?:ok|success|succeeded|passed|healthy|ready|valid)$", re.IGNORECASE)


def read_json(text: str, query: Query) -> Reading | None:
    """A reading of a JSON document or of JSON lines; None for anything else."""
    start = _next_nonblank(text, 0)
    if start == len(text) or text[start] not in "{[":
        return None
    try:
        try:
            doc = json.loads(text)
        except ValueError:
            return _read_stream(text, start, query)
        return _read_document(doc, query, ())
    except RecursionError:  # nesting deeper than the interpreter's stack
        return None


# -- detection -----------------------------------------------------------------------


def _read_stream(text: str, start: int, query: Query) -> Reading | None:
    """JSON lines, concatenated documents, or one document with a few lines after it."""
    items: list[tuple[Any, str] | str] = []  # (value, its source) or a line that is not JSON
    num_values = num_lines = 0
    pos, end_of_text = start, len(text)
    while pos < end_of_text:
        end = None
        if text[pos] in "{[":
            try:
                value, end = _DECODER.raw_decode(text, pos)
            except ValueError:
                end = None
            if end is not None:
                eol = _end_of_line(text, end)
                if text[end:eol].strip():  # more after the value on its line: not JSON lines
                    end = None
        if end is None:
            line_start = text.rfind("\n", 0, pos) + 1
            end = _end_of_line(text, pos)
            items.append(text[line_start:end].rstrip())
            num_lines += 1
            if num_lines > 3 and num_lines > num_values:
                return None
        else:
            items.append((value, text[pos:end]))
            num_values += 1
        pos = _next_nonblank(text, end)
    if num_values == 0 or isinstance(items[0], str):
        return None
    if num_values == 1:
        trailer = tuple(line for line in items[1:] if isinstance(line, str))
        if len(trailer) > _MAX_TRAILER_LINES or sum(map(len, trailer)) > 500:
            return None
        return _read_document(items[0][0], query, trailer)
    values = [item[0] for item in items if not isinstance(item, str)]
    if num_lines * 4 > num_values or sum(isinstance(v, dict) for v in values) * 5 < 4 * num_values:
        return None
    return _Builder(query).stream(items)


def _next_nonblank(text: str, pos: int) -> int:
    found = _NONBLANK.search(text, pos)
    return len(text) if found is None else found.start()


def _end_of_line(text: str, pos: int) -> int:
    eol = text.find("\n", pos)
    return len(text) if eol < 0 else eol


def _read_document(doc: Any, query: Query, trailer: tuple[str, ...]) -> Reading:
    builder = _Builder(query)
    builder.document(doc)
    for line in trailer:
        builder.add(line, Tier.SHAPE, 0)
    return Reading(method="json", pieces=tuple(builder.pieces))


# -- collections and their profile ---------------------------------------------------


@dataclass(slots=True)
class _Collection:
    path: str
    node: list[Any] | dict[str, Any]

    @property
    def keyed(self) -> bool:
        return isinstance(self.node, dict)

    def label(self) -> str:
        kind = "object" if self.keyed else "array"
        return f'{kind} "{self.path}"' if self.path else kind

    def items(self) -> list[tuple[str | None, Any]]:
        if isinstance(self.node, dict):
            return list(self.node.items())
        return [(None, item) for item in self.node]


def _find_collections(node: Any, path: str, found: dict[int, _Collection], depth: int) -> None:
    if depth > 64:
        return
    if isinstance(node, list):
        if len(node) >= _MIN_ARRAY and sum(isinstance(x, dict) for x in node) * 5 >= 4 * len(node):
            found[id(node)] = _Collection(path, node)
            return
        for i, item in enumerate(node):
            if isinstance(item, (dict, list)):
                _find_collections(item, f"{path}[{i}]", found, depth + 1)
    elif isinstance(node, dict):
        if len(node) >= _MIN_KEYED and sum(isinstance(x, dict) for x in node.values()) * 10 >= (
            9 * len(node)
        ):
            found[id(node)] = _Collection(path, node)
            return
        for key, value in node.items():
            if isinstance(value, (dict, list)):
                _find_collections(value, _join(path, key), found, depth + 1)


@dataclass(slots=True)
class _Field:
    """One key path across the records of a collection."""

    path: str
    route: tuple[str, ...]  # the keys from the record down: ("status", "phase")
    present: list[int] = field(default_factory=list)  # records that hold the key
    filled: list[int] = field(default_factory=list)  # ... with a non-empty value
    scalars: list[tuple[int, Any]] = field(default_factory=list)
    children: dict[str, _Field] = field(default_factory=dict)
    # Filled in by finish(), once every record is seen:
    keys: list[str] = field(default_factory=list)  # each scalar as counted: "true", "3"
    counts: Counter[str] = field(default_factory=Counter)
    kinds: Counter[type] = field(default_factory=Counter)
    numbers: list[tuple[int, float]] = field(default_factory=list)

    def finish(self) -> None:
        values = [v for _, v in self.scalars]
        self.keys = [v if type(v) is str else _value_key(v) for v in values]
        self.counts = Counter(self.keys)
        self.kinds = Counter(_KINDS.get(type(v), type(v)) for v in values)
        if self.kinds.get(int, 0) * 5 >= 4 * len(values):
            self.numbers = [(i, x) for i, v in self.scalars if (x := _number(v)) is not None]


_KINDS: dict[type, type] = {float: int}  # ints and floats are one kind of value


def _profile(records: list[Any]) -> dict[str, _Field]:
    """Every key path of the records (to _MAX_DEPTH), in order of first appearance."""
    fields: dict[str, _Field] = {}
    top: dict[str, _Field] = {}
    for index, record in enumerate(records):
        if isinstance(record, dict):
            _profile_object(record, None, top, index, fields)
    for f in fields.values():
        f.finish()
    return fields


def _profile_object(
    obj: dict[str, Any],
    parent: _Field | None,
    children: dict[str, _Field],
    index: int,
    fields: dict[str, _Field],
) -> None:
    for key, value in obj.items():
        f = children.get(key)
        if f is None:
            route = (*parent.route, key) if parent is not None else (key,)
            path = ".".join(map(str, route))
            f = children[key] = fields[path] = _Field(path, route)
        f.present.append(index)
        if value:  # 0, "", null, false, [] and {} are empty
            f.filled.append(index)
        if type(value) is dict:
            if len(f.route) < _MAX_DEPTH:
                _profile_object(value, f, f.children, index, fields)
        elif type(value) is not list:
            f.scalars.append((index, value))


@dataclass(slots=True)
class _Standout:
    tier: Tier
    rarity: int  # how many records share what makes this one stand out; fewer first
    routes: set[tuple[str, ...]] = field(default_factory=set)  # the keys that make it


def _standouts(fields: dict[str, _Field], n: int) -> dict[int, _Standout]:
    """Records unlike their siblings, by index."""
    found: dict[int, _Standout] = {}

    def note(index: int, tier: Tier, rarity: int, route: tuple[str, ...]) -> None:
        old = found.get(index)
        if old is None:
            found[index] = _Standout(tier, rarity, {route})
            return
        old.routes.add(route)
        if (tier, rarity) < (old.tier, old.rarity):
            old.tier, old.rarity = tier, rarity

    if n < _MIN_SIBLINGS:
        return found
    few = max(1, n // 20)
    for f in fields.values():
        route, name = f.route, str(f.route[-1])
        parent = fields.get(".".join(map(str, route[:-1])))
        if len(f.present) <= few and (parent is None or len(parent.present) > few):
            tier = Tier.ALARM if _ERROR_KEY.search(name) and f.filled else Tier.STANDOUT
            for index in f.present:
                note(index, tier, len(f.present), route)
        if (_ERROR_KEY.search(name) or _NOTE_KEY.match(name)) and 0 < len(f.filled) * 2 <= n:
            tier = Tier.ALARM if _ERROR_KEY.search(name) else Tier.STANDOUT
            for index in f.filled:
                note(index, tier, len(f.filled), route)
        if len(f.scalars) < _MIN_SIBLINGS:
            continue
        kinds = f.kinds
        if len(kinds) > 1:  # a null or a string where the others hold numbers
            for index, value in f.scalars:
                count = kinds[_KINDS.get(type(value), type(value))]
                if count <= few:
                    note(index, Tier.STANDOUT, count, route)
        counts = f.counts
        if 2 <= len(counts) <= _MAX_LOW_CARDINALITY and len(counts) * 3 <= len(f.scalars):
            rare = {key for key, count in counts.items() if count <= few}
            for (index, value), key in zip(f.scalars, f.keys, strict=True):
                if key in rare:
                    alarm = (
                        _ALARM_VALUE.search(value)
                        if isinstance(value, str)
                        else (value is False and _GOOD_FLAG.match(name))
                    )
                    note(index, Tier.ALARM if alarm else Tier.STANDOUT, counts[key], route)
        if len(f.numbers) >= 8:
            outliers = _outliers([x for _, x in f.numbers])
            for index, x in f.numbers:
                if x in outliers:
                    note(index, Tier.STANDOUT, len(outliers), route)
    return found


def _outliers(values: list[float]) -> set[float]:
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


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        x = float(value)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


_LITERALS = {True: "true", False: "false", None: "null"}


def _value_key(value: Any) -> str:
    """A scalar as it is counted: JSON's spelling of literals, numbers as written."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool):
        return _LITERALS[value]
    return repr(value)


# -- the summary line ------------------------------------------------------------------


def _summary(label: str, records: list[Any], fields: dict[str, _Field]) -> str:
    n = len(records)
    parts = [f"{label}: {n} records"]
    top = [f for f in fields.values() if len(f.route) == 1]
    if top:
        keys = [f.path if len(f.present) == n else f"{f.path} ({len(f.present)})" for f in top]
        more = f", +{len(keys) - _MAX_KEYS_SHOWN} more" if len(keys) > _MAX_KEYS_SHOWN else ""
        parts.append("keys " + ", ".join(keys[:_MAX_KEYS_SHOWN]) + more)
    stats = []
    for order, f in enumerate(fields.values()):
        described = _describe(f)
        if described is not None:
            text, varied = described
            stats.append((not varied, len(f.route), order, text))
    chosen = sorted(sorted(stats)[:_MAX_STATS], key=lambda s: s[2])
    parts.extend(text for *_, text in chosen)
    return "[" + "; ".join(parts) + "]"


def _describe(f: _Field) -> tuple[str, bool] | None:
    """A field's range or value counts, and whether it varies; None for ids and text."""
    num_nulls = f.kinds.get(type(None), 0)
    if len(f.scalars) - num_nulls < 2:
        return None
    numbers = [x for _, x in f.numbers]
    counts = f.counts
    if numbers and len(numbers) + num_nulls == len(f.scalars) and len(counts) > _MAX_COUNTED:
        low, high = min(numbers), max(numbers)
        decimals = 0 if all(type(v) is int for _, v in f.scalars if v is not None) else 2
        sep = ".." if low < 0 else "-"
        return f"{f.path} {_format(low, decimals)}{sep}{_format(high, decimals)}", True
    if f.kinds.get(str, 0) + num_nulls == len(f.scalars):
        dates = [v for _, v in f.scalars if v is not None]
        if all(_DATE.match(v) for v in dates):
            low, high = min(dates), max(dates)
            if low[:10] != high[:10]:
                low, high = low[:10], high[:10]
            return f"{f.path} {low}..{high}", low != high
    if len(counts) > _MAX_LOW_CARDINALITY or len(counts) == len(f.scalars):
        return None
    shown = ", ".join(f"{_clip(v, 30)} {c}" for v, c in counts.most_common(4))
    if len(counts) > 4:
        shown += f", +{len(counts) - 4} more"
    return f"{f.path} {shown}", len(counts) > 1


def _format(x: float, decimals: int) -> str:
    if decimals == 0 or abs(x) >= 1e9:
        return f"{x:.0f}" if abs(x) < 1e15 else f"{x:.3g}"
    return f"{x:.2f}" if abs(x) >= 0.01 or x == 0 else f"{x:.3g}"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- rendering -------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


class _Elider:
    """Renders a long record in about _MAX_RECORD characters, markers in place of what
    was left out (``{…}``, ``[…12]``, ``"…": "+8 keys"``). Scalars are kept in order while
    room lasts, and the scalars of the record's own objects (``metadata.name``); what holds
    a term, and the keys that make the record stand out, are kept whatever the room."""

    __slots__ = ("keep", "markers", "room", "terms")

    def __init__(self, terms: tuple[str, ...]) -> None:
        self.terms = terms
        self.markers: list[str] = []
        self.keep: set[tuple[str, ...]] = set()
        self.room = 0

    def render(self, value: Any, keep: set[tuple[str, ...]]) -> str:
        self.markers.clear()
        self.keep = {route[:i] for route in keep for i in range(1, len(route) + 1)}
        self.room = _MAX_RECORD
        shown = self._elide(value, (), 0)
        return _SENTINEL.sub(self._marker, _dumps(shown))

    def mark(self, marker: str) -> str:
        self.markers.append(marker)
        return f"\ue000{len(self.markers) - 1}\ue000"

    def _marker(self, match: re.Match[str]) -> str:
        i = int(match.group(1))
        return self.markers[i] if i < len(self.markers) else match.group(0)

    def _mentions(self, text: str) -> bool:
        return any(term in text for term in self.terms)

    def _elide(self, value: Any, route: tuple[str, ...], depth: int) -> Any:
        if isinstance(value, list):
            return self._elide_list(value, route, depth)
        if not isinstance(value, dict):
            return _cut(value, self._mentions)
        shown: dict[str, Any] = {}
        num_left_out = 0
        for key, item in value.items():
            sub = (*route, key)
            wanted = sub in self.keep
            part: Any
            if isinstance(item, (dict, list)) and item:
                text = _dumps(item)
                wanted = wanted or self._mentions(text)
                if len(text) <= _MAX_NESTED and (wanted or len(text) < self.room):
                    part = item
                elif wanted or (depth == 0 and self.room > _MAX_NESTED // 2):
                    part = self._elide(item, sub, depth + 1)  # charges the room itself
                    text, wanted = "", True
                else:
                    part = self.mark("{…}" if isinstance(item, dict) else f"[…{len(item)}]")
                    text = "[…]"
                    wanted = self.room > -_MARKER_ROOM  # a marker shows the shape cheaply
            else:
                part = _cut(item, self._mentions)
                text = _dumps(part)
                wanted = wanted or self._mentions(f"{key} {text}")
            cost = len(str(key)) + 4 + len(text)
            if cost > self.room and not wanted:
                num_left_out += 1
                continue
            self.room -= cost
            shown[key] = part
        if num_left_out:
            shown["…"] = self.mark(f'"+{num_left_out} keys"')
        return shown

    def _elide_list(self, value: list[Any], route: tuple[str, ...], depth: int) -> list[Any]:
        """The items that hold a term; each run of the others as one ``…N`` marker."""
        shown: list[Any] = []
        num_skipped = 0
        for item in value:
            if self.terms and self._mentions(_dumps(item)):
                if num_skipped:
                    shown.append(self.mark(f"…{num_skipped}"))
                    num_skipped = 0
                shown.append(self._elide(item, route, depth + 1))
            else:
                num_skipped += 1
        if num_skipped:
            shown.append(self.mark(f"…{num_skipped}"))
        return shown


def _cut(value: Any, mentions: Callable[[str], bool]) -> Any:
    """A long string's head and how much was cut, unless it holds a term."""
    if isinstance(value, str) and len(value) > _MAX_STRING and not mentions(value):
        cut = _MAX_STRING - 40
        return value[:cut] + f"…(+{len(value) - cut} chars)"
    return value


def _join(path: str, key: Any) -> str:
    key = str(key)
    if not _PLAIN_KEY.match(key):
        key = "[" + json.dumps(key, ensure_ascii=False) + "]"
        return path + key
    return f"{path}.{key}" if path else key


def _scalar_text(value: Any) -> str:
    if isinstance(value, str):
        if len(value) > _MAX_STRING * 2:
            value = value[:_MAX_STRING] + f"…(+{len(value) - _MAX_STRING} chars)"
        plain = value and value == value.strip() and not any(c in value for c in '\n\r\t"')
        return value if plain else json.dumps(value, ensure_ascii=False)
    return json.dumps(value)


# -- pieces ----------------------------------------------------------------------------


class _Builder:
    """Collects the pieces of one reading in the order they are shown."""

    def __init__(self, query: Query) -> None:
        self.query = query
        self.pieces: list[Piece] = []
        self.elider = _Elider(query.terms)
        self.collections: dict[int, _Collection] = {}

    def add(self, text: str, tier: Tier, key: float, what: str = "lines") -> None:
        self.pieces.append(Piece(text, (int(tier), key, len(self.pieces)), what, 1))

    def document(self, doc: Any) -> None:
        _find_collections(doc, "", self.collections, 0)
        if id(doc) in self.collections:
            self.collection(self.collections[id(doc)])
            return
        envelope = self._envelope(doc)
        if len(envelope) <= _MAX_ENVELOPE:
            self.add(envelope, Tier.SHAPE, 0)
            for collection in self.collections.values():
                self.collection(collection)
            return
        # Too long for one line: a line per value, each collection in its place.
        if not self.collections and isinstance(doc, dict):
            keys = ", ".join(map(str, list(doc)[:_MAX_KEYS_SHOWN]))
            more = f", +{len(doc) - _MAX_KEYS_SHOWN} more" if len(doc) > _MAX_KEYS_SHOWN else ""
            self.add(f"[object: {len(doc)} keys; {keys}{more}]", Tier.SHAPE, 0)
        elif not self.collections:
            self.add(f"[array: {len(doc)} values]", Tier.SHAPE, 0)
        other = Tier.CONTEXT if self.collections else Tier.REST
        lines = list(_path_lines(doc, "", self.collections, 0))
        texts = [line for line in lines if isinstance(line, str)]
        scores = iter(_asked(self.query, texts))
        for line in lines:
            if isinstance(line, _Collection):
                self.collection(line)
            elif score := next(scores):
                self.add(line, Tier.ASKED, -score)
            else:
                self.add(line, other, 0)

    def _envelope(self, doc: Any) -> str:
        markers: list[str] = []

        def replace(node: Any, depth: int) -> Any:
            found = self.collections.get(id(node))
            if found is not None:
                markers.append(f"[… {found.path or 'records'}: {len(found.node)} records]")
                return f"\ue000{len(markers) - 1}\ue000"
            if depth > 64:
                return node
            if isinstance(node, dict):
                return {k: replace(v, depth + 1) for k, v in node.items()}
            if isinstance(node, list):
                return [replace(v, depth + 1) for v in node]
            return node

        text = _dumps(replace(doc, 0))
        return _SENTINEL.sub(lambda m: markers[int(m.group(1))], text) if markers else text

    def collection(self, collection: _Collection) -> None:
        self._records(collection.label(), collection.items())

    def stream(self, items: list[tuple[Any, str] | str]) -> Reading:
        # Lines that are not JSON go in their place among the records.
        records: list[tuple[str | None, Any]] = [
            (None, item[0]) for item in items if not isinstance(item, str)
        ]
        self._records("json lines", records, items)
        return Reading(method="json", pieces=tuple(self.pieces))

    def _records(
        self,
        label: str,
        items: list[tuple[str | None, Any]],
        stream: list[tuple[Any, str] | str] | None = None,
    ) -> None:
        records = [item for _, item in items]
        fields = _profile(records)
        self.add(_summary(label, records, fields), Tier.SHAPE, 0)
        standouts = _standouts(fields, len(records))
        if stream is not None:  # the lines as printed, where one holds one value
            fulls = [
                source if "\n" not in source else _dumps(value)
                for value, source in (item for item in stream if not isinstance(item, str))
            ]
        else:
            fulls = [_dumps(item) for item in records]
        if any(key is not None for key, _ in items):
            fulls = [f"{_dumps(key)}: {full}" for (key, _), full in zip(items, fulls, strict=True)]
        scores = _asked(self.query, fulls)
        lines = iter(stream) if stream is not None else None
        for index, (key, record) in enumerate(items):
            shown = None
            if lines is not None:
                for line in lines:
                    if not isinstance(line, str):
                        shown = _source_line(line[1])
                        break
                    self._stray_line(line)
            standout = standouts.get(index)
            if shown is None:
                shown = fulls[index]
                if len(shown) > _MAX_RECORD:
                    keep = standout.routes if standout is not None else set()
                    shown = self.elider.render(record, keep)
                    if key is not None:
                        shown = f"{_dumps(key)}: {shown}"
            if scores[index]:
                self.add(shown, Tier.ASKED, -scores[index], "records")
            elif standout is not None:
                self.add(shown, standout.tier, standout.rarity, "records")
            elif index == 0:
                self.add(shown, Tier.CONTEXT, 0, "records")
            else:
                self.add(shown, Tier.REST, 0, "records")
        if lines is not None:
            for line in lines:
                if isinstance(line, str):
                    self._stray_line(line)

    def _stray_line(self, line: str) -> None:
        if self.query.mentions(line):
            self.add(line, Tier.ASKED, -1)
        else:
            self.add(line, Tier.ALARM if _ALARM_VALUE.search(line) else Tier.STANDOUT, 1)


def _source_line(source: str) -> str | None:
    """A JSON line as it was printed, when it is one line and not long."""
    source = source.strip()
    return source if len(source) <= _MAX_RECORD and "\n" not in source else None


def _asked(query: Query, texts: list[str]) -> list[float]:
    """How much each text has to do with the call: its selective terms, then the
    question's rare words (a word in few texts: "failed" among 500 charges)."""
    scores = [10.0 * count for count in _matches(query, texts)]
    content = [w for w in query.words if len(w) >= 4 and w.isalpha()]
    if content:
        relevance = Relevance(content, texts)
        least = math.log(max(2.0, min(10.0, (len(texts) + 1) / 2)))
        for i, text in enumerate(texts if relevance else ()):
            score = relevance.score(text)
            if score >= least:
                scores[i] += score
    return scores


def _matches(query: Query, texts: list[str]) -> list[int]:
    """How many of the call's selective terms each text holds. A term is selective as in
    ``Query.picks``: in at most a tenth of the texts, or ten; where it stands alone in some
    (``ord_42``), its hits inside a longer word (``ord_420``) are other names."""
    counts = [0] * len(texts)
    limit = max(10, len(texts) // 10)
    for term in query.terms:
        hits = [i for i, text in enumerate(texts) if term in text]
        if hits:
            alone = re.compile(r"(?<!\w)" + re.escape(term) + r"(?!\w)")
            hits = [i for i in hits if alone.search(texts[i])] or hits
        if len(hits) <= limit:
            for i in hits:
                counts[i] += 1
    return counts


def _path_lines(
    node: Any, path: str, collections: dict[int, _Collection], depth: int
) -> Iterator[str | _Collection]:
    """``path: value`` lines in document order; a collection where it stands."""
    found = collections.get(id(node))
    if found is not None:
        yield found
        return
    if not isinstance(node, (dict, list)):
        yield f"{path or '.'}: {_scalar_text(node)}"
        return
    if path and depth > 0:
        text = _dumps(node)
        if len(text) <= _MAX_LINE_VALUE or depth > 64:
            yield f"{path}: {text}"
            return
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _path_lines(value, _join(path, key), collections, depth + 1)
        return
    run: list[Any] = []  # consecutive short scalars, one line per hundred characters
    run_start = run_size = 0
    for i, item in enumerate(node):
        short = not isinstance(item, (dict, list)) and len(_scalar_text(item)) < _MAX_NESTED
        if run and (not short or run_size > _MAX_LINE_VALUE):
            yield _run_line(path, run_start, run)
            run, run_size = [], 0
        if short:
            if not run:
                run_start = i
            run.append(item)
            run_size += len(_scalar_text(item)) + 2
        else:
            yield from _path_lines(item, f"{path}[{i}]", collections, depth + 1)
    if run:
        yield _run_line(path, run_start, run)


def _run_line(path: str, start: int, run: list[Any]) -> str:
    if len(run) == 1:
        return f"{path}[{start}]: {_scalar_text(run[0])}"
    return f"{path}[{start}..{start + len(run) - 1}]: {_dumps(run)}"
