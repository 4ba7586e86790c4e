"""Tables: CSV and TSV, markdown tables, psql and mysql boxes, whitespace-aligned columns.

The header (a box's borders with it), one line of counts and ranges per table, and
footers such as ``(500 rows)`` come first; then the rows the call names (a term, an
identifier or rare words of the question, or a threshold in it such as "above 90%" met in
a column of that unit), then rows that stand out in a column (a value seen in few rows of
a column of few values, ALARM where it reads as a failure: ``CrashLoopBackOff``,
``Exited (137)``; a numeric outlier), then the rest in order. Rows are the original
lines, alignment kept. ``_table_layouts`` finds the tables.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import islice, zip_longest

from policies.readers._quantities import (
    Threshold,
    decimal_commas,
    percent_name,
    quantity,
    thresholds,
)
from policies.readers._ranking import asked, few, outliers, reads_as_failure, value_counts
from policies.readers._table_layouts import Layout, Row, Table, is_frame, layout_of
from policies.readers.pieces import Piece, Query, Reading, Tier

__all__ = ["read_table"]

_MIN_SIBLINGS = 5  # fewer rows are too few to say that one is unlike the others
_MAX_LOW_CARDINALITY = 8
_MAX_STATS = 4  # every token of the summary is taken from the rows
_MAX_NUMBERS_COUNTED = 3  # a numeric column of more values shows its range, not counts
_MAX_EDGE_LINES = 6  # lines before or after the tables kept with the header
_SAMPLE_LINES = 50
_ALARM_SHARE = 4  # a failure in at most 1/4 of a column's cells picks its rows out

_DIGITS = re.compile(r"\d+(?:[.:,]\d+)*")
_EMPTY_CELLS = frozenset(("", "-", "--", "<none>", "none", "n/a", "N/A", "null", "NULL", "?"))
_ID_NAME = re.compile(r"(?:^|[\s_.\-])(?i:id|uid|uuid|pid|ppid|sha|hash)$|^#$|[a-z](?:Id|ID)$")


def read_table(text: str, query: Query) -> Reading | None:
    """A reading of the tables that make up ``text``; None when it is not mostly tables."""
    layout = layout_of(text)
    if layout is None:
        return None
    return Reading(method="table", pieces=tuple(_Builder(query).build(layout)))


# -- columns ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Column:
    name: str
    cells: list[tuple[int, str]]  # (row, cell) for the non-empty cells
    kind: str | None = None  # numeric columns: their values' kind
    quantities: dict[int, float] = field(default_factory=dict)  # row -> value in the base
    counts: Counter[str] = field(default_factory=Counter)
    classes: tuple[list[str], Counter[str]] | None = None  # see classify

    @classmethod
    def of(cls, name: str, index: int, values: tuple[str, ...]) -> _Column:
        counts = Counter(values)
        empty = [value for value in counts if value in _EMPTY_CELLS]
        for value in empty:
            del counts[value]
        cells = list(enumerate(values))
        if empty:
            cells = [(r, cell) for r, cell in cells if cell not in _EMPTY_CELLS]
        column = cls(name, cells, counts=counts)
        column.measure()
        column.classify(index)
        return column

    def measure(self) -> None:
        """Parse the column's values as quantities when most of them are; a column named in
        percent (``mem_used_pct``) holds percentages."""
        cells = self.cells
        sample = list(islice(self.counts, _SAMPLE_LINES))
        comma = any("," in cell for cell in sample) and decimal_commas(sample)
        if sum(quantity(cell, decimal_comma=comma) is not None for cell in sample) * 2 < len(
            sample
        ):
            return  # text: not worth parsing every value
        parsed = {
            cell: q
            for cell in self.counts
            if (q := quantity(cell, decimal_comma=comma)) is not None
        }
        if parsed and sum(self.counts[cell] for cell in parsed) * 5 >= 4 * len(cells):
            kind = Counter(q.kind for q in parsed.values()).most_common(1)[0][0]
            if kind == "" and percent_name(self.name):
                kind = "%"
            self.kind = kind
            self.quantities = {
                r: q.value
                for r, cell in cells
                if (q := parsed.get(cell)) is not None and q.kind in (kind, "")
            }

    def low_cardinality(self) -> bool:
        """A few values, each repeated: a status, a region, a type."""
        return _few_values(self.counts, len(self.cells))

    def classify(self, index: int) -> None:
        """Each cell's class when the column's cells fall in a few: its value, or where
        values differ in their digits alone ("Up 2 hours", "Exited (1) 3 hours ago"), its
        value with the digits masked. None for names, ids and numbers."""
        if self.low_cardinality():
            self.classes = ([cell for _, cell in self.cells], self.counts)
            return
        if self.kind is not None or index == 0 or len(self.counts) * 2 > len(self.cells):
            return  # numbers, the rows' names, or values mostly unique: ids, times, text
        shape_of: dict[str, str] = {}
        counts: Counter[str] = Counter()
        for value, count in self.counts.items():
            shape = shape_of[value] = _DIGITS.sub("#", value)
            counts[shape] += count
            if len(counts) > _MAX_LOW_CARDINALITY:
                return
        if _few_values(counts, len(self.cells)):
            self.classes = ([shape_of[cell] for _, cell in self.cells], counts)


def _has_rare(counts: Counter[str]) -> bool:
    return min(counts.values()) <= few(sum(counts.values()))


def _few_values(counts: Counter[str], num_cells: int) -> bool:
    return 2 <= len(counts) <= _MAX_LOW_CARDINALITY and len(counts) * 3 <= num_cells


def _summary(table: Table, columns: list[_Column]) -> str:
    """The table's size and its most telling columns' counts or ranges, in column order."""
    parts = [f"{table.kind}: {len(table.rows)} rows, {len(table.names)} columns"]
    stats = []
    for order, column in enumerate(columns):
        described = _describe(column)
        if described is not None:
            text, telling = described
            stats.append((telling, order, text))
    chosen = sorted(sorted(stats)[:_MAX_STATS], key=lambda s: s[1])
    parts.extend(text for *_, text in chosen)
    return "[" + "; ".join(parts) + "]"


def _describe(column: _Column) -> tuple[str, int] | None:
    """A column's range or value counts, and how little it tells (0: a rare value beside a
    usual one, 1: a range, 2: a few values, 3: ids' range or one value); None for names,
    text."""
    name = column.name or "(unnamed)"
    varied = len(column.counts) > 1
    if column.quantities and len(column.counts) > _MAX_NUMBERS_COUNTED:
        low = min(column.quantities, key=column.quantities.__getitem__)
        high = max(column.quantities, key=column.quantities.__getitem__)
        cells = dict(column.cells)
        sep = ".." if column.quantities[low] < 0 else "-"
        telling = 3 if _ID_NAME.search(name) or cells[low] == cells[high] else 1
        return f"{name} {cells[low]}{sep}{cells[high]}", telling
    classes = column.classes
    if classes is not None and (column.low_cardinality() or _has_rare(classes[1])):
        counts = classes[1]  # by value, or by shape where one is rare: "Exited (#) …"
        usual = counts.most_common(1)[0][1] * 2 >= counts.total()
        telling = 0 if usual and _has_rare(counts) else 2
    elif not varied and len(column.cells) > 1:
        counts, telling = column.counts, 3
    else:
        return None
    return f"{name} {value_counts(counts, counts.total())}", telling


# -- what the call asked for, what stands out ------------------------------------------


def _asked_by_threshold(columns: list[_Column], found: list[Threshold]) -> Counter[int]:
    """Rows meeting a threshold in the columns it names, or in every column of its kind
    where it names none; a percentage also in a named column of plain numbers to 100."""
    met: Counter[int] = Counter()
    for threshold in found:
        targets = [c for c in columns if c.kind == threshold.kind and c.quantities]
        named = [c for c in targets if threshold.names(c.name)]
        if not named and threshold.kind == "%":
            named = [
                c
                for c in columns
                if c.kind == "" and c.quantities and threshold.names(c.name)
                if min(c.quantities.values()) >= 0 and max(c.quantities.values()) <= 100
            ]
        rows = {r for c in named or targets for r, x in c.quantities.items() if threshold.met(x)}
        met.update(rows)
    return met


@dataclass(slots=True)
class _Standout:
    tier: Tier
    rarity: int  # how many rows share what makes this one stand out; fewer first


def _standouts(columns: list[_Column], rows: list[Row]) -> dict[int, _Standout]:
    """Rows unlike the others: a rare value or shape in a column of few (ALARM where it
    reads as a failure, as does a failure in a quarter of the rows or fewer), a numeric
    outlier, a CSV row of more or fewer fields."""
    found: dict[int, _Standout] = {}

    def note(r: int, tier: Tier, rarity: int) -> None:
        old = found.get(r)
        if old is None or (tier, rarity) < (old.tier, old.rarity):
            found[r] = _Standout(tier, rarity)

    n = len(rows)
    if n < _MIN_SIBLINGS:
        return found
    rare_count = few(n)
    width = Counter(len(row.cells) for row in rows).most_common(1)[0][0]
    for r, row in enumerate(rows):
        if row.cells and len(row.cells) != width:
            note(r, Tier.STANDOUT, 1)
    for column in columns:
        classes = column.classes
        if classes is not None:
            keys, counts = classes
            failing = {key for key in counts if reads_as_failure(key)}
            if sum(counts[key] for key in failing) * _ALARM_SHARE > len(keys):
                failing = set()  # failures are usual here: a rare one still stands out
            for (r, cell), key in zip(column.cells, keys, strict=True):
                if counts[key] <= rare_count or key in failing:
                    tier = Tier.ALARM if reads_as_failure(cell) else Tier.STANDOUT
                    note(r, tier, counts[key])
        if len(column.quantities) >= 8:
            far = outliers(list(column.quantities.values()))
            for r, x in column.quantities.items():
                if x in far:
                    note(r, Tier.STANDOUT, len(far))
    return found


# -- pieces ----------------------------------------------------------------------------


class _Builder:
    """Collects the pieces of one reading in the order they are shown."""

    def __init__(self, query: Query) -> None:
        self.query = query
        self.thresholds = thresholds(query)
        self.pieces: list[Piece] = []

    def add(
        self,
        text: str,
        tier: Tier,
        key: float,
        what: str = "lines",
        count: int = 1,
        then: float = 0,
    ) -> None:
        """A piece ranked ``(tier, key, then)``, then in reading order."""
        self.pieces.append(Piece(text, (int(tier), key, then, len(self.pieces)), what, count))

    def build(self, layout: Layout) -> list[Piece]:
        tables = [i for i, seg in enumerate(layout) if isinstance(seg, Table)]
        before = layout[: tables[0]]
        after = layout[tables[-1] + 1 :]
        for i, segment in enumerate(layout):
            if isinstance(segment, Table):
                self.table(segment)
                continue
            # A title or a footer is kept with the header; lines between tables are context.
            edge = (i < tables[0] and len(before) <= _MAX_EDGE_LINES) or (
                i > tables[-1] and len(after) <= _MAX_EDGE_LINES
            )
            if self.query.mentions(segment):
                self.add(segment, Tier.ASKED, -1)
            else:
                self.add(segment, Tier.SHAPE if edge else Tier.CONTEXT, 0)
        return self.pieces

    def table(self, table: Table) -> None:
        rows = table.rows
        # Cells by column; a short row's missing cells are empty, a long row's extra ignored.
        by_column = zip_longest(*(row.cells for row in rows), fillvalue="")
        columns = [
            _Column.of(name, c, values)
            for c, (name, values) in enumerate(zip(table.names, by_column, strict=False))
        ]
        self.add(_summary(table, columns), Tier.SHAPE, 0)
        if table.head:
            self.add("\n".join(table.head), Tier.SHAPE, 0, "lines", len(table.head))
        # A term that names a column (``SELECT queue, status``) picks no row out.
        texts = [row.text.replace("\n", " ") for row in rows]
        scores = asked(self.query, texts, skip=set(table.names))
        by_threshold = _asked_by_threshold(columns, self.thresholds)
        standouts = _standouts(columns, rows)
        for r, row in enumerate(rows):
            score = scores[r] + 10.0 * by_threshold[r]
            standout = standouts.get(r)
            if score:  # what also stands out first
                then = standout.tier if standout is not None else Tier.REST
                self.add(row.text, Tier.ASKED, -score, "rows", then=then)
            elif standout is not None:
                self.add(row.text, standout.tier, standout.rarity, "rows")
            else:
                self.add(row.text, Tier.REST, 0, "rows")
        for line in table.tail:  # a closing border or a count of rows: room allowing
            self.add(line, Tier.CONTEXT if is_frame(line) else Tier.SHAPE, 0)
