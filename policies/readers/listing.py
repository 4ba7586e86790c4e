"""Listings and search results: ``find``, ``git ls-files``, ``ls -l``/``-R``, ``tree``,
``du``, and ``grep -rn``/``rg`` matches.

A listing is read when most lines are entries of one of these formats. A summary comes
first: the entries and the directories (or files, for matches) they fall in, the largest
groups with their counts. Then entries whose path or text holds the call's terms, its
glob patterns, or the most of its rare words, each with the lines needed to place it (its
``ls -R`` directory header, its ``tree`` ancestors, its ``rg`` file heading); then, for
``du``, the largest; then the first entries; then the rest in order.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Callable

from policies.readers.pieces import Piece, Query, Reading, Tier
from policies.readers.relevance import Relevance

__all__ = ["read_listing"]

_PATH = re.compile(r"(?:\.{0,2}/)?[\w.@+-]+(?:/[\w.@+ -]+)*/?")
_LS = re.compile(
    r"[-dlcbps][rwxsStT-]{9}[.@+]?\s+\d+\s+\S+\s+\S+\s+[\d.,]+[KMGTP]?\s+"
    r"\w{3}\s+\d+\s+[\d:]+\s+(?P<name>.+)"
)
_LS_OTHER = re.compile(r"total \d+|(?P<dir>\S.*):$")
_TREE = re.compile(r"(?P<indent>(?:[│|]   |    )*)(?:[├└|`]── |[├└|`]-- )(?P<name>.+)")
_DU = re.compile(r"(?P<size>[\d.]+[KMGTP]?)\t(?P<name>.+)")
_MATCH = re.compile(r"(?P<name>[^\s:\[][^\s:]*?):(?P<line>\d+)[:-](?:\d+:)?(?P<text>.*)")
# rg --heading: "12:text" hits and "12-text" context lines (never a date: "2024-04-19").
_RG_HIT = re.compile(r"(?P<line>\d+)(?::|-(?!\d\d[-T ]))(?P<text>.*)")
_SHARE = 0.7  # of non-blank lines that must be entries
_ABOUT_SIZE = re.compile(
    r"(?i)\b(?:big|bigger|biggest|large|larger|largest|size|sizes|space|disk|heavy|heaviest)\b"
)
_MIN_ENTRIES = 20
_GROUPS = 4  # largest groups named in the summary
_GROUP_SHARE = 20  # a group is named when it holds at least 1/20 of the entries
_HEAD = 5  # first entries kept before the rest
# (form, each line's path or None, the lines that place each entry, each entry's size)
_Parsed = tuple[str, list[str | None], dict[int, list[int]], dict[int, float]]
_SIZES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}


def read_listing(text: str, query: Query) -> Reading | None:
    lines = text.split("\n")
    parsed = _parse(lines)
    if parsed is None:
        return None
    form, paths, place, sizes = parsed
    named = {i: path for i, path in enumerate(paths) if path is not None}
    entries = list(named)
    globs = [
        token.strip("'\"")
        for value in _argument_strings(query)
        for token in value.split()
        if any(c in token for c in "*?[")
    ]
    # A hit under an rg heading is read with its file's name.
    texts = {i: lines[i] if named[i] in lines[i] else f"{named[i]} {lines[i]}" for i in entries}
    relevance = Relevance(query.words, list(texts.values()))
    mentions = {entries[k] for k in query.picks_in([lines[i] for i in entries])}
    defines = _definition(query.names) if form == "matches" else None
    sized = _sized(form, query, paths, sizes)
    asked: dict[int, float] = {}
    for i in entries:
        path = paths[i] or ""
        score = relevance.score(texts[i]) if relevance else 0.0
        hit = _MATCH.match(lines[i]) or _RG_HIT.match(lines[i]) if defines is not None else None
        if hit is not None and defines is not None and defines.match(hit["text"]):
            score += 20.0  # where a searched name is defined: what a search is most often for
        score += sized.get(i, 0.0)
        if i in mentions:
            score += 10.0
        if globs and any(
            fnmatch.fnmatch(path, g) or fnmatch.fnmatch(path.rsplit("/", 1)[-1], g) for g in globs
        ):
            score += 5.0
        if score > 0:
            asked[i] = score
    # The lines that place an asked entry, kept right after the best one (shown before it).
    needed: dict[int, tuple[float, float]] = {}
    for i, score in asked.items():
        for j in place.get(i, ()):
            needed[j] = min(needed.get(j, (-score, i + 0.5)), (-score, i + 0.5))
    largest = sorted(entries, key=lambda i: -sizes.get(i, 0))[: len(entries) // 10] if sizes else []
    large = {i: k for k, i in enumerate(largest)}
    first = set(entries[:_HEAD])
    pieces = [
        Piece(_summary(form, [paths[i] or "" for i in entries]), (Tier.SHAPE, 0), "entries", 0)
    ]
    what = "matches" if form == "matches" else "entries"
    for i, line in enumerate(lines):
        if not line.strip():
            continue  # a blank line between files or groups says nothing
        if i in asked:
            rank: tuple[float, ...] = (Tier.ASKED, -asked[i], i)
        elif i in needed:
            rank = (Tier.ASKED, *needed[i])
        elif i in large:
            rank = (Tier.STANDOUT, large[i])
        elif i in first:
            rank = (Tier.CONTEXT, i)
        elif paths[i] is None:
            rank = (Tier.REST, 0, i)  # headers and totals, shown before plain entries
        else:
            rank = (Tier.REST, 1, i)
        pieces.append(Piece(line, rank, what if paths[i] is not None else "lines"))
    return Reading("listing", tuple(pieces))


def _parse(lines: list[str]) -> _Parsed | None:
    nonblank = [line for line in lines if line.strip()]
    if len(nonblank) < _MIN_ENTRIES:
        return None
    sample = nonblank[:: max(1, len(nonblank) // 200)]
    forms: tuple[tuple[Callable[[str], object], Callable[[list[str]], _Parsed]], ...] = (
        (_is_ls, _parse_ls),
        (_TREE.match, _parse_tree),
        (_DU.fullmatch, _parse_du),
        (_is_match, _parse_matches),
        (_is_path, _parse_paths),
    )
    for test, parse in forms:
        if sum(1 for line in sample if test(line)) < _SHARE * len(sample):
            continue
        if parse is _parse_matches and sum(1 for line in sample if _is_hit(line)) < len(sample) / 3:
            continue  # file names with no hits under them: a listing of paths
        return parse(lines)
    return None


def _is_hit(line: str) -> bool:
    return _MATCH.match(line) is not None or _RG_HIT.match(line) is not None


def _is_path(line: str) -> bool:
    return "/" in line and _PATH.fullmatch(line) is not None


def _is_ls(line: str) -> bool:
    return bool(_LS.match(line) or _LS_OTHER.fullmatch(line))


def _is_match(line: str) -> bool:
    """A ``path:line:text`` hit, or, under ``rg --heading``, a file's name or a
    ``line:text`` hit below it (blank lines between files do not count)."""
    found = _MATCH.match(line)
    if found is not None:
        return any(c in found.group("name") for c in "/.")
    return _RG_HIT.match(line) is not None or _PATH.fullmatch(line) is not None


def _parse_ls(lines: list[str]) -> _Parsed:
    paths: list[str | None] = []
    place: dict[int, list[int]] = {}
    header = -1
    directory = ""
    for i, line in enumerate(lines):
        if (found := _LS.match(line)) is not None:
            paths.append(f"{directory}/{found.group('name')}" if directory else found.group("name"))
            if header >= 0:
                place[i] = [header]
        elif (other := _LS_OTHER.fullmatch(line)) is not None and other.group("dir"):
            directory, header = other.group("dir").rstrip("/"), i
            paths.append(None)
        else:
            paths.append(None)
    return "ls", paths, place, {}


def _parse_tree(lines: list[str]) -> _Parsed:
    paths: list[str | None] = []
    place: dict[int, list[int]] = {}
    stack: list[tuple[int, str]] = []  # (line, name) of each ancestor, by depth
    for i, line in enumerate(lines):
        found = _TREE.match(line)
        if found is None:
            paths.append(None)
            continue
        depth = len(found.group("indent")) // 4
        del stack[depth:]
        name = found.group("name").strip()
        paths.append("/".join([*(n for _, n in stack), name]))
        place[i] = [j for j, _ in stack]
        stack.append((i, name.rstrip("/")))
    return "tree", paths, place, {}


def _parse_du(lines: list[str]) -> _Parsed:
    paths: list[str | None] = []
    sizes: dict[int, float] = {}
    for i, line in enumerate(lines):
        found = _DU.fullmatch(line)
        if found is None:
            paths.append(None)
            continue
        paths.append(found.group("name"))
        size = found.group("size")
        unit = size[-1] if size[-1] in _SIZES else ""
        sizes[i] = float(size.rstrip("KMGTP")) * _SIZES[unit]
    return "du", paths, {}, sizes


def _parse_matches(lines: list[str]) -> _Parsed:
    paths: list[str | None] = []
    place: dict[int, list[int]] = {}
    heading = -1
    heading_name = ""
    for i, line in enumerate(lines):
        if (found := _MATCH.match(line)) is not None:
            paths.append(found.group("name"))
        elif heading >= 0 and _RG_HIT.match(line):
            paths.append(heading_name)  # rg --heading: the file is the heading above
            place[i] = [heading]
        elif line.strip() and _PATH.fullmatch(line):
            heading, heading_name = i, line
            paths.append(None)
        else:
            paths.append(None)
    return "matches", paths, place, {}


def _parse_paths(lines: list[str]) -> _Parsed:
    paths: list[str | None] = [line if _PATH.fullmatch(line) else None for line in lines]
    return "paths", paths, {}, {}


def _summary(form: str, paths: list[str]) -> str:
    if form == "matches":
        groups = Counter(paths)
        unit, kind = "matches", "files"
    else:
        groups = Counter(
            path.rstrip("/").rsplit("/", 1)[0] if "/" in path.rstrip("/") else "." for path in paths
        )
        unit, kind = "entries", "directories"
    # The largest groups, where they hold a good share: a group of a few says nothing.
    named = [(g, n) for g, n in groups.most_common(_GROUPS) if n * _GROUP_SHARE >= len(paths)]
    largest = ", ".join(f"{group} {n:,}" for group, n in named)
    more = f", {len(groups) - len(named):,} more" if named and len(groups) > len(named) else ""
    listed = f": {largest}{more}" if named else ""
    return f"[{len(paths):,} {unit} in {len(groups):,} {kind}{listed}]"


def _sized(
    form: str, query: Query, paths: list[str | None], sizes: dict[int, float]
) -> dict[int, float]:
    """For a question about size (``du``, "the biggest file"), a score for the largest
    entries: files before the directories that hold them, largest first."""
    if not sizes or not _ABOUT_SIZE.search(query.question):
        return {}
    folders = {p.rsplit("/", 1)[0] for p in paths if p and "/" in p}
    ranked = sorted(sizes, key=lambda i: (paths[i] in folders, -sizes[i], i))
    top = ranked[: max(_HEAD, len(ranked) // 20)]
    return {i: 30.0 - 10.0 * (paths[i] in folders) - k / len(top) for k, i in enumerate(top)}


def _definition(names: tuple[str, ...]) -> re.Pattern[str] | None:
    """A line that defines one of ``names``: an assignment, a declaration, a config key."""
    if not names:
        return None
    name = "|".join(re.escape(n) for n in names)
    return re.compile(
        rf"\s*(?:(?:export|public|private|static|final|readonly|const|let|var|val|pub)\s+)*"
        rf"(?:(?:{name})\b\s*(?::[^=\n]*)?(?<![=!<>])=(?!=)|(?:{name})\s*:|"
        rf"(?:def|class|func|fn|type|interface|struct|enum|#define)\s+(?:{name})\b)"
    )


def _argument_strings(query: Query) -> list[str]:
    return [v for v in (query.arguments or {}).values() if isinstance(v, str)]
