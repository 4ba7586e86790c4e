"""JSON documents and JSON lines: the envelope, a summary per record collection, records.

A record collection is an array of objects (or an object of objects, keyed by name) that
is not inside another collection; JSON lines, and a stream of documents as jq prints
them, are one collection. Each record is one line: as printed where it is short, else in
its short form (``_json_form``: identity and state first, urls and hashes left out). The
envelope (the document with each collection replaced by a marker naming its path and
length) and one line of counts and ranges per collection (``_json_fields``) come first;
then the records the call names (a term, an identifier or rare words of the question),
then those unlike their siblings (ALARM where one reads as a failure), then the first
record, which shows the shape, then the rest in order. A document without collections
that is too long for one line becomes ``path: value`` lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from policies.readers._json_fields import Standout, profile, standouts, summary
from policies.readers._json_form import ShortForms
from policies.readers._ranking import asked, call_terms, mentions_failure, selective
from policies.readers.pieces import Piece, Query, Reading, Tier
from policies.readers.relevance import words

__all__ = ["read_json"]

_MAX_RECORD = 300  # characters of a record shown whole; a longer one is in its short form
_MAX_NESTED = 80  # a list item this short stays on its path line
_MAX_STRING = 160  # a string longer than this is cut in a path line
_MAX_ENVELOPE = 400  # a longer envelope becomes path lines
_MAX_LINE_VALUE = 100  # a container this short is one path line
_MIN_ARRAY = 3  # a shorter array of objects stays in the envelope
_MIN_KEYED = 8  # an object of objects needs this many to be a collection
_MAX_TRAILER_LINES = 3  # lines after a document kept as its footer ("HTTP 200")
_MAX_KEYS_SHOWN = 12
_QUESTION_WORDS = frozenset(("who", "where", "when"))

_DECODER = json.JSONDecoder()
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": "))  # one record a line
_NONBLANK = re.compile(r"\S")
_SENTINEL = re.compile('"\ue000(\\d+)\ue000"')
_PLAIN_KEY = re.compile(r"[\w\-@$/:]+$")


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


# -- rendering -------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


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
        self.terms = call_terms(query)
        # The question's content words (a key holding one names what it asks for), and
        # what it asks for by its question words: who, where, when.
        self.asked_words = {
            w for w in words(query.question) if w in query.words or w in _QUESTION_WORDS
        }
        self.collections: dict[int, _Collection] = {}

    def add(self, text: str, tier: Tier, key: float, what: str = "lines", then: float = 0) -> None:
        """A piece ranked ``(tier, key, then)``, then in reading order."""
        self.pieces.append(Piece(text, (int(tier), key, then, len(self.pieces)), what, 1))

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
        scores = iter(asked(self.query, texts))
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
        fields = profile(records)
        self.add(summary(label, len(records), fields.fields), Tier.SHAPE, 0)
        unlike = standouts(fields.fields, len(records))
        forms = ShortForms(fields.common(), fields.opaque, self.asked_words)
        if stream is not None:  # the lines as printed, where one holds one value
            fulls = [
                source if "\n" not in source else _dumps(value)
                for value, source in (item for item in stream if not isinstance(item, str))
            ]
        else:
            fulls = [_dumps(item) for item in records]
        if any(key is not None for key, _ in items):
            fulls = [f"{_dumps(key)}: {full}" for (key, _), full in zip(items, fulls, strict=True)]
        picked = selective(self.terms, fulls)
        scores = asked(self.query, fulls, words_in=fields.searched, picked=picked)
        terms_in: dict[int, list[str]] = {}  # the selective terms each record holds
        for term, hits in picked.items():
            for i in hits:
                terms_in.setdefault(i, []).append(term)
        lines = iter(stream) if stream is not None else None
        for index, (key, record) in enumerate(items):
            shown = None
            if lines is not None:
                for line in lines:
                    if not isinstance(line, str):
                        shown = _source_line(line[1])
                        break
                    self._stray_line(line)
            standout = unlike.get(index)
            if shown is None:
                shown = fulls[index]
                if len(shown) > _MAX_RECORD:
                    shown = self._short(record, fulls[index], standout, forms, terms_in.get(index))
                    if key is not None:
                        shown = f"{_dumps(key)}: {shown}"
            if scores[index]:  # what also stands out first
                then = standout.tier if standout is not None else Tier.REST
                self.add(shown, Tier.ASKED, -scores[index], "records", then)
            elif standout is not None:  # the rarer, then the more ways unlike the others
                self.add(shown, standout.tier, standout.rarity, "records", -len(standout.routes))
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
            self.add(line, Tier.ALARM if mentions_failure(line) else Tier.STANDOUT, 1)

    def _short(
        self,
        record: Any,
        full: str,
        standout: Standout | None,
        forms: ShortForms,
        terms: list[str] | None,
    ) -> str:
        """A long record in its short form (another long value cut)."""
        if not isinstance(record, dict):
            return full[: _MAX_RECORD - 20] + f"…(+{len(full) - _MAX_RECORD + 20} chars)"
        if standout is None:
            return forms.render(record, terms=terms or ())
        return forms.render(record, keep=standout.routes, alarms=standout.alarms, terms=terms or ())


def _source_line(source: str) -> str | None:
    """A JSON line as it was printed, when it is one line and not long."""
    source = source.strip()
    return source if len(source) <= _MAX_RECORD and "\n" not in source else None


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
