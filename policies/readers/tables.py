"""Tables: CSV and TSV, markdown tables, psql and mysql boxes, whitespace-aligned columns.

The header (a box's borders with it), one line of counts and ranges per table, and
footers such as ``(500 rows)`` come first; then the rows the call names (a term, a rare
word of the question, or a threshold in it such as "above 90%" met in a column of that
unit), then rows that stand out in a column (a value seen in few rows of a column of few
values, ALARM where it reads as a failure: ``CrashLoopBackOff``, ``Exited (137)``; a
numeric outlier), then the rest in order. Rows are the original lines, alignment kept.

A text is a table only when its tables hold most of its lines, and only by a
structure a table has: a box border, a ``|---|`` or psql ``---+---`` rule under a header,
a delimiter splitting most rows into the same number of short fields, or a header of words
over columns whose gaps line up in every row. Prose, logs and diffs are left alone.
"""

from __future__ import annotations

import csv
import math
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice, zip_longest
from typing import Any, NamedTuple

from policies.readers.pieces import Piece, Query, Reading, Tier
from policies.readers.relevance import Relevance, words

__all__ = ["read_table"]

_MIN_ROWS = 2
_MIN_SIBLINGS = 5  # fewer rows are too few to say that one is unlike the others
_MAX_LOW_CARDINALITY = 8
_OUTLIER_Z = 6.0
_MAX_STATS = 6
_MAX_NUMBERS_COUNTED = 3  # a numeric column of more values shows its range, not counts
_MAX_EDGE_LINES = 6  # lines before or after the tables kept with the header
_SAMPLE_LINES = 50
_DIFF_PREFIX = 8192  # a diff shows its headers within this many characters

_JSON_START = re.compile(r"\s*(?:\{|\[\s*[\[{\"\d\-\]]|\[\s*$)")  # JSON: its reader's
_DIFF = re.compile(r"^(?:diff --git |@@ -\d|--- a/|\+\+\+ b/|Index: \S)", re.MULTILINE)
_H = "-─━═+┬┳┼╋┴┻╤╪╧╦╬╩┯┿┷╇╈╉╊:"  # a border's inner characters
_BOX_BORDER = re.compile(
    rf"^\s*[+┌┏╭├┝┞┟┠┡┢┣╞╟╔╠└┗╰╘╚╒╓╙][{_H}]*[-─━═][{_H}]*[+┐┓╮┤┥┦┧┨┩┪┫╡╢╕╖╗╣┘┛╯╛╝╜]\s*$"
)
_BOX_CELLS = re.compile(r"^\s*[|│┃║].*[|│┃║]\s*$")
_BOX_BAR = re.compile(r"[|│┃║]")
_PSQL_RULE = re.compile(r"^-+(?:\+-+)+$")
_MD_RULE = re.compile(
    r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)+\|?\s*$|^\s*\|\s*:?-{3,}:?\s*\|\s*$"
)
_MD_BAR = re.compile(r"(?<!\\)\|")
_ROWS_FOOTER = re.compile(r"^\s*(?:\(\d[\d,]* rows?\)|\d[\d,]* rows? in set\b.*|Empty set\b.*)$")
_DASH_RULE = re.compile(r"^\s*[-=]{2,}(?:\s+[-=]{2,})+\s*$")  # a rule per column
_FULL_RULE = re.compile(r"^\s*[-=]{3,}\s*$")
_HEADER_WORD = re.compile(r"[A-Za-z%#][\w%#.+/()\[\]:?\-]*$")
_HEADER_GAP = re.compile(r"\S {2,}\S")
_TOKEN = re.compile(r"\S+")
_QUANTITY = re.compile(
    r"([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+) ?([A-Za-zµ%]+)?(?: \(.*\))?$"
)
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+(?:\.\d+)?)s)?$")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+$")
_DIGITS = re.compile(r"\d+(?:[.:,]\d+)*")
_THRESHOLD = re.compile(
    r"(?P<op>>=|<=|≥|≤|>|<|\b(?:above|over|exceed(?:s|ing)?|more than|greater than|"
    r"higher than|larger than|bigger than|at least|no less than|below|under|less than|"
    r"fewer than|lower than|smaller than|at most|no more than)\b)"
    r"\s*(?P<num>[-+]?\d+(?:[.,]\d+)?)\s?(?P<unit>%|[A-Za-zµ]+\b)?",
    re.IGNORECASE,
)
_ALARM_VALUE = re.compile(
    r"fail|error|exception|crash|fatal|panic|denied|refused|rejected|timed?.?out|"
    r"killed|oom|unhealthy|invalid|abort|backoff|unreachable|critical|exited \([1-9]",
    re.IGNORECASE,
)
_EMPTY_CELLS = frozenset(("", "-", "--", "<none>", "none", "n/a", "N/A", "null", "NULL", "?"))


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


def read_table(text: str, query: Query) -> Reading | None:
    """A reading of the tables that make up ``text``; None when it is not mostly tables."""
    if not text.strip() or _JSON_START.match(text) or _DIFF.search(text, 0, _DIFF_PREFIX):
        return None
    lines = text.splitlines()
    num_nonblank = sum(1 for line in lines if line.strip())
    if num_nonblank < _MIN_ROWS + 1:
        return None
    bars = any(bar in text for bar in "|│┃║")  # every box, psql and markdown table has them
    layout = (bars and _boxes(lines, num_nonblank)) or _aligned(lines, num_nonblank)
    if layout is None:
        layout = _delimited(text, lines, num_nonblank)
    if layout is None:
        return None
    return Reading(method="table", pieces=tuple(_Builder(query).build(layout)))


# -- the table structures ---------------------------------------------------------------


@dataclass(slots=True)
class _Table:
    kind: str  # "table", "csv", "tsv"
    head: list[str]  # the header's lines: borders, header, rule
    names: list[str]
    rows: list[_Row]
    tail: list[str] = field(default_factory=list)  # a closing border, "(500 rows)"

    def num_lines(self) -> int:
        return len(self.head) + sum(row.text.count("\n") + 1 for row in self.rows) + len(self.tail)


@dataclass(slots=True)
class _Row:
    text: str  # the original line (lines, for a grid box's multi-line row)
    cells: list[str]


_Layout = list[str | _Table]  # tables and the lines between them, in order


def _enough(layout: _Layout, num_nonblank: int, share: float) -> bool:
    tables = [seg for seg in layout if isinstance(seg, _Table)]
    if not any(len(t.rows) >= _MIN_ROWS for t in tables):
        return False
    return sum(t.num_lines() for t in tables) >= share * num_nonblank


def _boxes(lines: list[str], num_nonblank: int) -> _Layout | None:
    """Boxes (``+---+``, box-drawing), psql's ``---+---`` and markdown ``|---|`` tables."""
    layout: _Layout = []
    i, n = 0, len(lines)
    found = False
    while i < n:
        line = lines[i]
        table: _Table | None = None
        if "|" in line or "│" in line or "┃" in line or "║" in line or _BOX_BORDER.match(line):
            nxt = lines[i + 1] if i + 1 < n else ""
            if _BOX_BORDER.match(line):
                table, end = _box(lines, i)
            elif _PSQL_RULE.match(nxt) and line.count("|") == nxt.count("+"):
                table, end = _psql(lines, i)
            elif _MD_RULE.match(nxt) and _MD_BAR.search(line):
                table, end = _markdown(lines, i)
        if table is None:
            if line.strip():
                layout.append(line)
            i += 1
            continue
        found = True
        layout.append(table)
        i = end
    if not found or not _enough(layout, num_nonblank, 0.5):
        return None
    return layout


def _box(lines: list[str], start: int) -> tuple[_Table | None, int]:
    is_border: list[bool] = []  # per line of the box from start: a border, or cells
    end = start
    while end < len(lines):
        if _BOX_BORDER.match(lines[end]):
            is_border.append(True)
        elif _BOX_CELLS.match(lines[end]):
            is_border.append(False)
        else:
            break
        end += 1
    run = lines[start:end]
    borders = [i for i, border in enumerate(is_border) if border]
    if len(borders) < 2 or borders[1] == 1 or borders[1] == len(run) - 1:
        return None, start
    names = _box_cells(run[1])
    head, tail = run[: borders[1] + 1], []
    body, body_border = run[borders[1] + 1 :], is_border[borders[1] + 1 :]
    if body_border[-1]:
        tail.append(body.pop())
        body_border.pop()
    rows: list[_Row] = []
    if not any(body_border):
        rows = [_Row(line, _box_cells(line)) for line in body]
    else:  # a grid: a border after every row, whose cells may take several lines
        group: list[str] = []
        for line, border in zip(body, body_border, strict=True):
            group.append(line)
            if border:
                rows.append(_Row("\n".join(group), _box_cells(group[0])))
                group = []
        if group:
            rows.append(_Row("\n".join(group), _box_cells(group[0])))
    while end < len(lines) and _ROWS_FOOTER.match(lines[end]):
        tail.append(lines[end])
        end += 1
    if len(names) < 2 or not rows:
        return None, start
    return _Table("table", head, names, rows, tail), end


def _box_cells(line: str) -> list[str]:
    if "|" in line:  # the common case, without the box-drawing bars
        return [cell.strip() for cell in line.strip().split("|")[1:-1]]
    return [cell.strip() for cell in _BOX_BAR.split(line.strip())[1:-1]]


def _psql(lines: list[str], start: int) -> tuple[_Table | None, int]:
    names = [cell.strip() for cell in lines[start].split("|")]
    end = start + 2
    rows = []
    while end < len(lines) and "|" in lines[end] and not _ROWS_FOOTER.match(lines[end]):
        rows.append(_Row(lines[end], [cell.strip() for cell in lines[end].split("|")]))
        end += 1
    tail = []
    if end < len(lines) and _ROWS_FOOTER.match(lines[end]):
        tail.append(lines[end])
        end += 1
    return _Table("table", lines[start : start + 2], names, rows, tail), end


def _markdown(lines: list[str], start: int) -> tuple[_Table | None, int]:
    names = _markdown_cells(lines[start])
    end = start + 2
    rows = []
    while end < len(lines) and lines[end].strip() and _MD_BAR.search(lines[end]):
        rows.append(_Row(lines[end], _markdown_cells(lines[end])))
        end += 1
    if len(names) < 2:
        return None, start
    return _Table("table", lines[start : start + 2], names, rows), end


def _markdown_cells(line: str) -> list[str]:
    line = line.strip()
    if "\\|" not in line:  # no escaped bars: a plain split
        return [cell.strip() for cell in line.removeprefix("|").removesuffix("|").split("|")]
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") and not line.endswith("\\|") else line
    return [cell.strip() for cell in _MD_BAR.split(line)]


def _aligned(lines: list[str], num_nonblank: int) -> _Layout | None:
    """Columns aligned with spaces under a header of words (kubectl, docker, ps, df)."""
    layout: _Layout = []
    block: list[str] = []
    found = False
    for line in [*lines, ""]:
        if line.strip():
            block.append(line)
            continue
        if block:
            read = _aligned_block(block)
            if read is None:
                layout.extend(block)
            else:
                preamble, table = read
                layout.extend(preamble)
                layout.append(table)
                found = True
            block = []
    if not found or not _enough(layout, num_nonblank, 0.7):
        return None
    return layout


def _aligned_block(block: list[str]) -> tuple[list[str], _Table] | None:
    if sum("\t" in line for line in block) * 2 > len(block):
        return None  # tabs delimit (TSV); they do not align
    expanded = [line.expandtabs() if "\t" in line else line for line in block]
    for h in range(min(3, len(block) - _MIN_ROWS)):  # a line or two may come before the header
        header = expanded[h]
        if not _is_header(header):
            continue
        body_start = h + 1
        rule = None
        if _DASH_RULE.match(expanded[body_start]):
            rule = expanded[body_start]
            body_start += 1
        elif _FULL_RULE.match(expanded[body_start]):
            body_start += 1
        # A rule near the end sets off a footer (coverage's TOTAL); other rules are rows.
        stop = len(block)
        rules = [i for i in range(body_start, stop) if _FULL_RULE.match(expanded[i])]
        if rules and rules[-1] >= stop - 3:
            stop = rules.pop()
        inner_rules = set(rules)
        body = [expanded[i] for i in range(body_start, stop) if i not in inner_rules]
        if len(body) < _MIN_ROWS:
            continue
        spans = _column_spans(header, rule, body)
        if spans is None:
            continue
        names = [_slice(header, spans, c) for c in range(len(spans))]
        cuts = [end for _, end in spans[:-1]]
        bounds = list(zip([0, *cuts], [*cuts, None], strict=True))
        rows = [
            _Row(block[i], [] if i in inner_rules else _cells(expanded[i], spans, cuts, bounds))
            for i in range(body_start, stop)
        ]
        cells = [row for row in rows if row.cells]
        if not _consistent(cells, len(spans)) or not _unlike_rows(names, cells):
            continue
        return block[:h], _Table("table", block[h:body_start], names, rows, block[stop:])
    return None


def _is_header(line: str) -> bool:
    words = line.split()
    if len(words) < 2 or not _HEADER_GAP.search(line):
        return False
    return all(_HEADER_WORD.match(w) and w[-1] not in ".,;:!?" for w in words)


def _column_spans(header: str, rule: str | None, body: list[str]) -> list[tuple[int, int]] | None:
    """Where the columns are: runs of positions that some row or the header fills, split
    by gaps that the header and (nearly) every row leave blank."""
    if rule is not None:
        return [(m.start(), m.end()) for m in _TOKEN.finditer(rule)]
    width = max(len(header), max(map(len, body)))
    # How many rows fill each position: a column of the padded lines, less its spaces.
    padded = [line.ljust(width) for line in body]
    filled = [len(body) - "".join(chars).count(" ") for chars in zip(*padded, strict=True)]
    in_header = [False] * width
    for m in _TOKEN.finditer(header):
        in_header[m.start() : m.end()] = [True] * (m.end() - m.start())
    tolerance = len(body) // 50  # a value or two may spill into a gap
    spans: list[tuple[int, int]] = []
    clear_gap = False  # a gap of two or more that nothing crosses: the columns are real
    run_start = gap_start = -1
    count = 0
    gap_clear = True
    for p in range(width + 1):
        count = filled[p] if p < width else 0
        blank = p == width or (not in_header[p] and count <= tolerance)
        if blank and run_start >= 0:
            spans.append((run_start, p))
            run_start = -1
            gap_start, gap_clear = p, True
        elif not blank:
            if run_start < 0:
                if spans and gap_clear and p - gap_start >= 2:
                    clear_gap = True
                run_start = p
        elif count:
            gap_clear = False
    if not clear_gap:
        return None
    # A run with no header over it continues the column before it (values with spaces).
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and not any(in_header[start : min(end, len(in_header))]):
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    # A header word over no values, one space after the last, is part of its name ("Mounted on").
    spans = []
    for start, end in merged:
        if spans and start - spans[-1][1] == 1 and max(filled[start:end]) * 10 <= len(body):
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans if len(spans) >= 2 else None


def _cells(
    line: str,
    spans: list[tuple[int, int]],
    cuts: list[int],
    bounds: list[tuple[int, int | None]],
) -> list[str]:
    """The row cut where each column ends, when no value crosses a cut."""
    n = len(line)
    for end in cuts:
        if end < n and line[end] != " " and line[end - 1] != " ":
            return _cells_by_token(line, spans)
    return [line[start:end].strip() for start, end in bounds]


def _cells_by_token(line: str, spans: list[tuple[int, int]]) -> list[str]:
    """Each token goes to the column it starts in; one that starts in a gap and reaches
    into the next column (a right-aligned number that grew) goes to that column."""
    starts = [s for s, _ in spans]
    parts: list[list[int]] = [[] for _ in spans]  # [first start, last end] per column
    for m in _TOKEN.finditer(line):
        c = max(0, bisect_right(starts, m.start()) - 1)
        if m.start() >= spans[c][1] and c + 1 < len(spans) and m.end() > starts[c + 1]:
            c += 1
        if parts[c]:
            parts[c][1] = m.end()
        else:
            parts[c] = [m.start(), m.end()]
    return [line[p[0] : p[1]] if p else "" for p in parts]


def _slice(line: str, spans: list[tuple[int, int]], c: int) -> str:
    end = spans[c + 1][0] if c + 1 < len(spans) else len(line)
    return line[spans[c][0] : end].strip()


def _unlike_rows(names: list[str], rows: list[_Row]) -> bool:
    """Whether the header reads as names over values, not as one more row: in most
    columns its shape (``NAME``: A, ``Size``: Aa) is not the rows' usual one (``web-1``:
    a-9, ``7.8G``: 9.9A). ``ls`` prints file names in aligned columns, all of one shape."""
    num_unlike = 0
    for c, name in enumerate(names):
        shapes = Counter(_shape(row.cells[c]) for row in rows[:_SAMPLE_LINES] if row.cells[c])
        if shapes and _shape(name) != shapes.most_common(1)[0][0]:
            num_unlike += 1
    return num_unlike * 2 >= len(names)


def _shape(text: str) -> str:
    return _SHAPE_RUNS.sub(lambda m: m.group(0)[0], text.translate(_SHAPE_CLASSES))


_SHAPE_CLASSES = str.maketrans(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
    "A" * 26 + "a" * 26 + "9" * 10,
)
_SHAPE_RUNS = re.compile(r"(.)\1+")


def _consistent(rows: list[_Row], num_columns: int) -> bool:
    """Most rows fill most columns, the first one above all (a row's name)."""
    firsts = sum(1 for row in rows if row.cells[0])
    filled = sum(len(row.cells) - row.cells.count("") for row in rows)
    return firsts * 10 >= 8 * len(rows) and filled * 2 >= len(rows) * num_columns


def _delimited(text: str, lines: list[str], num_nonblank: int) -> _Layout | None:
    """CSV and TSV: one delimiter splits most rows into the same number of short fields."""
    sample = [line for line in lines[: _SAMPLE_LINES * 2] if line.strip()][:_SAMPLE_LINES]
    delimiter = None
    for candidate in "\t,;|":
        if sum(candidate in line for line in sample) * 10 < 8 * len(sample):
            continue
        try:
            counts = Counter(len(fields) for fields in csv.reader(sample, delimiter=candidate))
        except csv.Error:
            continue
        width, num = counts.most_common(1)[0]
        if width >= (3 if candidate == "|" else 2) and num * 10 >= 8 * sum(counts.values()):
            delimiter = candidate
            break
    if delimiter is None:
        return None
    rows = _csv_rows(text, delimiter)
    if rows is None or len(rows) < _MIN_ROWS + 1:
        return None
    width, num = Counter(len(row.cells) for row in rows).most_common(1)[0]
    if num * 20 < 17 * len(rows) or _prose(rows, width):
        return None
    first = rows[0].cells
    header = len(first) == width and not any(_quantity(cell) for cell in first)
    names = first if header else [f"column {i + 1}" for i in range(width)]
    kind = "tsv" if delimiter == "\t" else "csv"
    head = [rows[0].text] if header else []
    table = _Table(kind, head, names, rows[1:] if header else rows)
    if not _enough([table], num_nonblank, 0.9):
        return None
    return [table]


def _csv_rows(text: str, delimiter: str) -> list[_Row] | None:
    lines = text.splitlines(keepends=True)
    reader = csv.reader(lines, delimiter=delimiter)
    rows = []
    done = 0
    try:
        for fields in reader:
            source = "".join(lines[done : reader.line_num]).rstrip("\r\n")
            done = reader.line_num
            if fields and source.strip():
                rows.append(_Row(source, [f.strip() for f in fields]))
    except csv.Error:
        return None
    return rows


def _prose(rows: list[_Row], width: int) -> bool:
    """Sentences split at their commas, or log lines at a comma of their message or
    timestamp: a column of many-word text where the others are few (of two columns, a
    few words are enough: "[INFO] 10:00:01 step 3, done"), or rows that end like
    sentences."""
    sample = [row for row in rows[: _SAMPLE_LINES * 2] if len(row.cells) == width]
    wordy = 0
    for c in range(width):
        lengths = sorted(len(row.cells[c].split()) for row in sample)
        if lengths and lengths[len(lengths) // 2] > (3 if width == 2 else 6):
            wordy += 1
    sentences = sum(1 for row in sample if row.text.rstrip()[-1:] in ".!?")
    return wordy * 3 > width or sentences * 2 > len(sample)


# -- values --------------------------------------------------------------------------


class _Quantity(NamedTuple):
    value: float  # in the unit's base: seconds, bytes, percent
    kind: str  # "", "%", "time", "size", or an unknown unit's name


def _quantity(cell: str) -> _Quantity | None:
    if cell[:1].isdigit() and cell[-1].isdigit():
        try:
            value = float(cell)
        except ValueError:  # 1,234 or 1.2.3 or 10:00
            pass
        else:
            return _Quantity(value, "") if math.isfinite(value) else None
    m = _QUANTITY.match(cell)
    if m is not None:
        number, unit = m.group(1), m.group(2) or ""
        kind, factor = _UNITS.get(unit) or _UNITS.get(unit.lower()) or (unit.lower(), 1.0)
        return _Quantity(float(number.replace(",", "")) * factor, kind)
    if cell and cell[-1] in "dhms" and cell[0].isdigit():
        d = _DURATION.match(cell)  # kubectl's AGE: 3d4h, 5m20s
        if d is not None and any(d.groups()):
            days, hours, minutes, seconds = (float(g) if g else 0.0 for g in d.groups())
            return _Quantity(((days * 24 + hours) * 60 + minutes) * 60 + seconds, "time")
    return None


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
        """Parse the column's values as quantities when most of them are."""
        cells = self.cells
        sample = list(islice(self.counts, _SAMPLE_LINES))
        if sum(_quantity(cell) is not None for cell in sample) * 2 < len(sample):
            return  # text: not worth parsing every value
        parsed = {cell: q for cell in self.counts if (q := _quantity(cell)) is not None}
        if parsed and sum(self.counts[cell] for cell in parsed) * 5 >= 4 * len(cells):
            kind = Counter(q.kind for q in parsed.values()).most_common(1)[0][0]
            if kind == "" and "%" in self.name:
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
    return min(counts.values()) <= max(1, sum(counts.values()) // 20)


def _few_values(counts: Counter[str], num_cells: int) -> bool:
    return 2 <= len(counts) <= _MAX_LOW_CARDINALITY and len(counts) * 3 <= num_cells


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


def _summary(table: _Table, columns: list[_Column]) -> str:
    parts = [f"{table.kind}: {len(table.rows)} rows, {len(table.names)} columns"]
    stats = []
    for order, column in enumerate(columns):
        described = _describe(column)
        if described is not None:
            text, varied = described
            stats.append((not varied, order, text))
    chosen = sorted(sorted(stats)[:_MAX_STATS], key=lambda s: s[1])
    parts.extend(text for *_, text in chosen)
    return "[" + "; ".join(parts) + "]"


def _describe(column: _Column) -> tuple[str, bool] | None:
    """A column's range or value counts, and whether it varies; None for names and text."""
    name = column.name or "(unnamed)"
    varied = len(column.counts) > 1
    if column.quantities and len(column.counts) > _MAX_NUMBERS_COUNTED:
        low = min(column.quantities, key=column.quantities.__getitem__)
        high = max(column.quantities, key=column.quantities.__getitem__)
        cells = dict(column.cells)
        sep = ".." if column.quantities[low] < 0 else "-"
        return f"{name} {cells[low]}{sep}{cells[high]}", cells[low] != cells[high]
    classes = column.classes
    if classes is not None and (column.low_cardinality() or _has_rare(classes[1])):
        counts = classes[1]  # by value, or by shape where one is rare: "Exited (#) …"
    elif not varied and len(column.cells) > 1:
        counts = column.counts
    else:
        return None
    shown = ", ".join(f"{_clip(v, 30)} {c}" for v, c in counts.most_common(4))
    if len(counts) > 4:
        shown += f", +{len(counts) - 4} more"
    return f"{name} {shown}", varied


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- what the call asked for ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Threshold:
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
    "at most": "<=",
    "no more than": "<=",
}
_BELOW = ("below", "under", "less than", "fewer than", "lower than", "smaller than")


def _thresholds(query: Query) -> list[_Threshold]:
    found = []
    for text in (query.question, *_strings(query.arguments or {})):
        for m in _THRESHOLD.finditer(text):
            phrase = " ".join(m.group("op").lower().split())
            op = _OPS.get(phrase) or ("<" if phrase in _BELOW else ">")
            unit = m.group("unit") or ""
            known = _UNITS.get(unit) or _UNITS.get(unit.lower())
            kind, factor = known if known is not None else ("", 1.0)
            # The words around it name the column: "cpu above 90%", "less than 10 GB
            # available", "more than 5 restarts".
            near = set(words(text[max(0, m.start() - 40) : m.start()])[-3:])
            near.update(words(text[m.end("num") : m.end("num") + 30])[:2])
            number = m.group("num")
            value = float(number.replace(",", "" if _THOUSANDS.match(number) else "."))
            found.append(_Threshold(op, value * factor, kind, frozenset(near)))
    return found[:8]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _asked_by_threshold(columns: list[_Column], thresholds: list[_Threshold]) -> Counter[int]:
    met: Counter[int] = Counter()
    for threshold in thresholds:
        targets = [c for c in columns if c.kind == threshold.kind and c.quantities]
        named = [c for c in targets if threshold.names(c.name)]
        rows = {r for c in named or targets for r, x in c.quantities.items() if threshold.met(x)}
        met.update(rows)
    return met


def _asked(query: Query, texts: list[str]) -> list[float]:
    """How much each row has to do with the call: its selective terms, then the
    question's rare words (a word in few rows: "pending" among 40 pods)."""
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
    (``web-1``), its hits inside a longer word (``web-12``) are other names."""
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


# -- pieces ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Standout:
    tier: Tier
    rarity: int  # how many rows share what makes this one stand out; fewer first


def _standouts(columns: list[_Column], rows: list[_Row]) -> dict[int, _Standout]:
    found: dict[int, _Standout] = {}

    def note(r: int, tier: Tier, rarity: int) -> None:
        old = found.get(r)
        if old is None or (tier, rarity) < (old.tier, old.rarity):
            found[r] = _Standout(tier, rarity)

    n = len(rows)
    if n < _MIN_SIBLINGS:
        return found
    few = max(1, n // 20)
    width = Counter(len(row.cells) for row in rows).most_common(1)[0][0]
    for r, row in enumerate(rows):
        if row.cells and len(row.cells) != width:  # a CSV row of more or fewer fields
            note(r, Tier.STANDOUT, 1)
    for column in columns:
        classes = column.classes
        if classes is not None:
            keys, counts = classes
            rare = {key for key, count in counts.items() if count <= few}
            for (r, cell), key in zip(column.cells, keys, strict=True):
                if key in rare:
                    tier = Tier.ALARM if _ALARM_VALUE.search(cell) else Tier.STANDOUT
                    note(r, tier, counts[key])
        if len(column.quantities) >= 8:
            outliers = _outliers(list(column.quantities.values()))
            for r, x in column.quantities.items():
                if x in outliers:
                    note(r, Tier.STANDOUT, len(outliers))
    return found


class _Builder:
    """Collects the pieces of one reading in the order they are shown."""

    def __init__(self, query: Query) -> None:
        self.query = query
        self.thresholds = _thresholds(query)
        self.pieces: list[Piece] = []

    def add(self, text: str, tier: Tier, key: float, what: str = "lines", count: int = 1) -> None:
        self.pieces.append(Piece(text, (int(tier), key, len(self.pieces)), what, count))

    def build(self, layout: _Layout) -> list[Piece]:
        tables = [i for i, seg in enumerate(layout) if isinstance(seg, _Table)]
        before = layout[: tables[0]]
        after = layout[tables[-1] + 1 :]
        for i, segment in enumerate(layout):
            if isinstance(segment, _Table):
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

    def table(self, table: _Table) -> None:
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
        asked = _asked(self.query, [row.text.replace("\n", " ") for row in rows])
        by_threshold = _asked_by_threshold(columns, self.thresholds)
        standouts = _standouts(columns, rows)
        for r, row in enumerate(rows):
            score = asked[r] + 10.0 * by_threshold[r]
            standout = standouts.get(r)
            if score:
                self.add(row.text, Tier.ASKED, -score, "rows")
            elif standout is not None:
                self.add(row.text, standout.tier, standout.rarity, "rows")
            else:
                self.add(row.text, Tier.REST, 0, "rows")
        for line in table.tail:
            self.add(line, Tier.SHAPE, 0)
