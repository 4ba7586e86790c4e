"""The short form of a long JSON record: its identity and state first, on one line.

A record too long to show whole keeps, in document order: the first value that holds an
asked-for term and those that make it stand out (at any depth, with the name or type of
the list item they are in), its identity (``id``, ``name``, ``title``, ``number``,
``metadata.name``) and state (status, state, phase, conclusion, result, reason, message,
error), then people (``assignee.login``) and places (``status.podIP``), dates and
amounts, then other short values while room lasts. Urls, hashes and ids other than its
own, empty values, and objects of no interest are left out; each object that lost keys
says how many (``"…": "+12 keys"`` at the top, ``…3`` inside), each run of list items
left out too (``…4``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

from policies.readers._ranking import reads_as_failure
from policies.readers.relevance import words

__all__ = [
    "EACH",
    "ERROR_KEY",
    "Route",
    "ShortForms",
    "key_kind",
    "uninformative",
    "value_key",
]

EACH = "[]"  # a route's step into every item of a list: ("items", EACH, "name")
Route = tuple[str, ...]

_ROOM = 130  # characters of a short form, half of them past what it must keep
_MAX_STRING = 80  # a longer value is cut, unless it holds a term
_MAX_DEPTH = 6
_OPEN_DEPTH = 2  # objects this deep are looked into only for what is kept or asked
_MAX_ITEMS = 20  # list items looked into

_LITERALS = {True: "true", False: "false", None: "null"}
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": ")).encode
ERROR_KEY = re.compile(
    r"(?:^|_|(?<=[a-z]))(?:errors?|exception|failure|fault|err)(?:$|_|(?=[A-Z]))", re.IGNORECASE
)
_NAME_KEY = re.compile(
    r"^(?:name|title|number|key|slug|login|email|username|hostname|host|display_?name|"
    r"full_?name|summary|subject)$|[a-z]Name$|_name$",
    re.IGNORECASE,
)
_OWN_NAME = re.compile(r"^(?:name|title|number)$")  # what a record is called: always shown
_ITEM_NAME = re.compile(r"^(?:name|type|kind|key|id)$|[a-z]Name$|_name$")  # a list item's
_STATE_KEY = re.compile(
    r"^(?:status|state|phase|conclusion|result|outcome|health|level|severity|reason|message|"
    r"msg|code|exit_?code|status_?code|ready|decision|verdict)$|(?:_status|_state|Status|State)$",
    re.IGNORECASE,
)
_ID_KEY = re.compile(
    r"^(?:id|uid|uuid|guid|sha|etag|digest|token|cursor)$|(?:_id|_ids|_sha|_uuid|Id|ID|Ids|Sha)$",
)
_PERSON_KEY = re.compile(
    r"^(?:assignees?|user|owner|author|actor|creator|committer|sender|requester|reviewer|"
    r"merged_by|closed_by|userIdentity|principal|customer|account)$",
    re.IGNORECASE,
)
_PERSON_NAME = re.compile(r"^(?:login|name|email|username|userName|display_?name)$")
# Where a thing runs or lives (a word of its key): podIP, hostname, nodeName, zone.
_WHERE = frozenset(
    ("ip", "ipaddress", "host", "hostname", "node", "address", "addr", "zone", "region")
)
_URL = re.compile(r"[a-z][a-z0-9+.\-]*://\S+$")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
_HEX = re.compile(r"[0-9a-fA-F\-]{16,}$")
_TOKEN_CHARS = re.compile(r"[\w\-+/=:]{16,}$")
_CASE_STEP = re.compile(r"[a-z][A-Z0-9]|[A-Z][a-z0-9]|[0-9][A-Za-z]")


def key_kind(key: str) -> str:
    """What a key names, by its spelling: "state" (status, reason, error), "id" (an id
    or a hash), "name" (name, title, number), "person" (assignee, user), or "other"."""
    if ERROR_KEY.search(key) or _STATE_KEY.search(key):
        return "state"
    if _ID_KEY.search(key):
        return "id"
    if _NAME_KEY.search(key):
        return "name"
    if _PERSON_KEY.match(key):
        return "person"
    return "other"


def uninformative(value: Any) -> bool:
    """A url or an opaque token (a hash, a generated id): long, and says nothing read."""
    if type(value) is not str or len(value) < 16 or " " in value:
        return False
    if "://" in value and _URL.match(value):
        return True
    if not _TOKEN_CHARS.match(value) or _DATE.match(value):
        return False
    if _HEX.match(value) and sum(map(str.isdigit, value)) >= 4:
        return True
    return len(_CASE_STEP.findall(value)) * 4 >= len(value)


def value_key(value: Any) -> str:
    """A scalar as it is counted: JSON's spelling of literals, numbers as written."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool):
        return _LITERALS[value]
    return repr(value)


class ShortForms:
    """Renders the records of one collection in their short form. ``common`` names the
    routes whose value every record shares (the summary gives it): shown last; ``opaque``
    says of strings already seen whether they are urls or hashes; ``asked`` holds the
    question's words: a key holding one names what it asks for, and "who", "where" and
    "when" ask for people, places and dates. What it learns of a route or a string on the
    way is kept for the next record."""

    __slots__ = ("_asked", "_common", "_opaque", "_routes", "_strings")

    def __init__(
        self,
        common: Collection[Route] = (),
        opaque: dict[str, bool] | None = None,
        asked: Collection[str] = (),
    ) -> None:
        self._asked = frozenset(asked)
        self._common = frozenset(common)
        self._opaque = opaque if opaque is not None else {}  # see uninformative, by string
        self._routes: dict[Route, _RouteRank] = {}
        self._strings: dict[str, int] = {}  # a string's class: _ALARM, _OPAQUE, _WHEN, 0

    def render(
        self,
        record: dict[str, Any],
        *,
        keep: Mapping[Route, Collection[str] | None] | None = None,
        alarms: Collection[Route] = (),
        terms: Sequence[str] = (),
    ) -> str:
        """``record`` on one line. ``keep`` names the routes that make it stand out, each
        with the values that do (None: any), and ``terms`` what the call asked for: both
        are kept whatever the room; but where some of ``keep`` read as a failure
        (``alarms``), the rest of it but for states and messages comes room allowing."""
        keep = keep or {}
        identity = "id" if "id" in record else next((k for k in record if _ID_KEY.search(k)), None)
        # Below _OPEN_DEPTH, only where a kept route or (in a record holding one) a term is.
        inside = {route[:i] for route in keep for i in range(1, len(route) + 1)}
        wanted = _Wanted(keep, frozenset(alarms), terms, identity, inside, bool(terms), set())
        leaves: list[_Leaf] = []
        self._collect(record, (), (), "", leaves, wanted, False)
        leaves.sort(key=_by_rank)
        chosen = [leaf for leaf in leaves if leaf[0] == 0]
        # What it must keep takes room from the rest, down to half of it.
        must = sum(leaf[4] for leaf in chosen)
        room = max(_ROOM - must, _ROOM // 2)
        for leaf in leaves:
            if leaf[0] and leaf[4] <= room:
                chosen.append(leaf)
                room -= leaf[4]
        texts = {leaf[2]: _ENCODE(leaf[3]) if leaf[5] else leaf[3] for leaf in chosen}
        prefixes = {path[:i] for path in texts for i in range(1, len(path))}
        return _render(record, (), texts, prefixes)

    def _collect(
        self,
        node: dict[str, Any],
        path: tuple[str | int, ...],
        route: Route,
        parent: str,
        out: list[_Leaf],
        wanted: _Wanted,
        under_kept: bool,
    ) -> None:
        """The scalars of ``node`` (and of its objects and lists of objects), ranked, each
        with its value (a string unquoted, cut) or its text; ``under_kept``: ``node`` is in
        a kept object (a key few siblings have), whose values come first room allowing."""
        first = len(out)
        depth = len(route)
        for key, value in node.items():
            kind = type(value)
            if kind is dict or (kind is list and value and type(value[0]) is dict):
                if not value or depth + (1 if kind is dict else 2) >= _MAX_DEPTH:
                    continue
                sub_route = (*route, key) if kind is dict else (*route, key, EACH)
                if depth >= _OPEN_DEPTH and not wanted.deep and sub_route not in wanted.inside:
                    continue
                inner = under_kept or wanted.keep.get(sub_route, _NOT_KEPT) is None
                if kind is dict:
                    self._collect(value, (*path, key), sub_route, key, out, wanted, inner)
                    continue
                for i, item in enumerate(value[:_MAX_ITEMS]):
                    if type(item) is dict and item:
                        self._collect(item, (*path, key, i), sub_route, key, out, wanted, inner)
                continue
            sub_route = (*route, key)
            values = wanted.keep.get(sub_route, _NOT_KEPT)
            kept = values is None or (values is not _NOT_KEPT and value_key(value) in values)
            if (value is None or value == "" or value == []) and not kept:
                continue
            shown: Any = value if kind is str else str(value) if kind is int else _ENCODE(value)
            held = [t for t in wanted.terms if t in shown or t == key] if wanted.deep else ()
            if not held and len(shown) > _MAX_STRING:
                if kind is not str:
                    if not kept:
                        continue
                    shown = f"[…{len(value)}]"
                else:
                    shown = value[: _MAX_STRING - 1] + "…"
            rank = self._rank(sub_route, key, parent, value)
            if kept:  # where some read as failures, those and the states with them first
                state = self._routes[sub_route].state
                rank = 0 if not wanted.alarms or sub_route in wanted.alarms or state else 1
            elif depth == 0 and key == wanted.identity:
                rank = 0
            elif held:  # the first value holding a term is kept, the others room allowing
                rank = min(rank, 3) if wanted.seen.issuperset(held) else 0
            elif under_kept and rank < 9:
                rank = 1
            if held:
                wanted.seen.update(held)
            if rank < 9:
                quote = kind is str  # a string is quoted once chosen: its cost counts them
                cost = len(shown) + len(key) + (6 if quote else 4)
                out.append((rank, len(out), (*path, key), shown, cost, quote))
        if path and type(path[-1]) is int and any(leaf[0] == 0 for leaf in out[first:]):
            # What a kept value in a list item needs to be read: the item's name or type.
            for i in range(first, len(out)):
                leaf = out[i]
                item_key = leaf[2][-1]  # the item's own keys, not its objects'
                if leaf[0] and len(leaf[2]) == len(path) + 1 and _ITEM_NAME.search(str(item_key)):
                    out[i] = (0, *leaf[1:])

    def _rank(self, route: Route, key: str, parent: str, value: Any) -> int:
        """0: kept; 1 to 7, room allowing, in that order; 9: never shown."""
        known = self._routes.get(route)
        if known is None:
            known = self._routes[route] = _route_rank(route, key, parent, self._common, self._asked)
        if known.fixed is not None:
            return known.fixed
        if known.other_id:
            return 9
        kind = type(value)
        what = 0
        if kind is str and not known.state:
            what = self._strings.get(value, -1)
            if what < 0:
                what = self._strings[value] = self._string_class(value)
        if known.state or what == _ALARM:
            rank = 1 if known.depth <= 3 else 3
        elif what == _OPAQUE:
            return 9
        elif known.person or (known.where and known.depth <= 2):
            rank = 2
        elif known.name:
            rank = 1 if known.depth == 1 else 4
        elif what == _WHEN and "when" in self._asked:
            rank = 1
        elif known.depth == 1:
            rank = 2 if kind is int or kind is float or what == _WHEN else 3
        else:
            rank = 5
        if known.asked:  # what the question asks for: kept, but deep or in a list
            return 0 if known.depth <= 2 and not known.in_list else 1
        if known.in_list and rank >= 3:  # a list item's values say less than an object's,
            rank = 5 if known.item_name else 6  # but for its name
        return 7 if known.common else rank

    def _string_class(self, value: str) -> int:
        if reads_as_failure(value):
            return _ALARM
        opaque = self._opaque.get(value)
        if opaque is None:
            opaque = self._opaque[value] = uninformative(value)
        if opaque:
            return _OPAQUE
        return _WHEN if _DATE.match(value) else 0


def _by_rank(leaf: _Leaf) -> tuple[int, int]:
    return leaf[0], leaf[1]


# rank, order, path, what is shown, its cost in characters, whether it is a string to quote
_Leaf = tuple[int, int, tuple[str | int, ...], str, int, bool]
_NOT_KEPT: frozenset[str] = frozenset()
_ALARM, _OPAQUE, _WHEN = 1, 2, 3


class _Wanted(NamedTuple):
    keep: Mapping[Route, Collection[str] | None]
    alarms: frozenset[Route]
    terms: Sequence[str]
    identity: str | None
    inside: set[Route]  # the routes of objects a kept route goes through
    deep: bool  # the record holds a term: look everywhere
    seen: set[str]  # the terms shown so far: the first value holding one is kept


class _RouteRank(NamedTuple):
    """What a route's key says of its values' rank, whatever they are."""

    fixed: int | None  # the record's name: always shown
    depth: int
    state: bool
    other_id: bool
    person: bool
    where: bool
    name: bool
    in_list: bool
    item_name: bool
    common: bool
    # The question names the key ("on which bucket?" asks for bucketName) or what it holds
    # ("who?" asks for a person, "where?" for a place).
    asked: bool


def _route_rank(
    route: Route, key: str, parent: str, common: frozenset[Route], asked: frozenset[str]
) -> _RouteRank:
    depth = len(route)
    named = words(key)
    fixed = None
    if (depth == 1 and _OWN_NAME.match(key)) or (route == ("metadata", "name")):
        fixed = 0
    kind = key_kind(key)
    person = kind == "person" or bool(_PERSON_KEY.match(parent) and _PERSON_NAME.match(key))
    where = not _WHERE.isdisjoint(named)
    return _RouteRank(
        fixed,
        depth,
        kind == "state",
        kind == "id",
        person,
        where,
        kind == "name",
        EACH in route,
        EACH in route and _ITEM_NAME.search(key) is not None,
        route in common,
        not asked.isdisjoint(named) or (person and "who" in asked) or (where and "where" in asked),
    )


def _render(
    node: Any,
    path: tuple[str | int, ...],
    chosen: dict[tuple[str | int, ...], str],
    prefixes: set[tuple[str | int, ...]],
) -> str:
    if type(node) is dict:
        parts = []
        for key, value in node.items():
            sub = (*path, key)
            if sub in chosen:
                parts.append(f"{_ENCODE(key)}: {chosen[sub]}")
            elif sub in prefixes:
                parts.append(f"{_ENCODE(key)}: {_render(value, sub, chosen, prefixes)}")
        left = len(node) - len(parts)
        if left:
            parts.append(f'"…": "+{left} keys"' if not path else f"…{left}")
        return "{" + ", ".join(parts) + "}"
    items = []
    skipped = 0
    for i, item in enumerate(node):
        sub = (*path, i)
        if sub in prefixes or sub in chosen:
            if skipped:
                items.append(f"…{skipped}")
                skipped = 0
            items.append(chosen.get(sub) or _render(item, sub, chosen, prefixes))
        else:
            skipped += 1
    if skipped:
        items.append(f"…{skipped}")
    return "[" + ", ".join(items) + "]"
