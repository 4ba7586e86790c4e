"""Where the tables of a text are: CSV and TSV, markdown tables, psql and mysql boxes,
whitespace-aligned columns.

A text is tables only when its tables hold most of its lines, and only by a structure a
table has: a box border, a ``|---|`` or psql ``---+---`` rule under a header, a delimiter
splitting most rows into the same number of short fields, or a header of words over
columns whose gaps line up in every row (or, where values wider than their column push
the rest right, one word per column but the last). Prose, logs, diffs and listings
(``du``: sizes beside paths, without a header) are left alone.
"""

from __future__ import annotations

import csv
import re
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field

from policies.readers._quantities import quantity

__all__ = ["Layout", "Row", "Table", "is_frame", "layout_of"]

_MIN_ROWS = 2
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


def layout_of(text: str) -> Layout | None:
    """The tables of ``text`` and the lines between them; None when it is not mostly tables."""
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
    return layout


def is_frame(line: str) -> bool:
    """A box's border or a count of rows: what the header and a summary already show."""
    return bool(_BOX_BORDER.match(line) or _ROWS_FOOTER.match(line))


@dataclass(slots=True)
class Table:
    kind: str  # "table", "csv", "tsv"
    head: list[str]  # the header's lines: borders, header, rule
    names: list[str]
    rows: list[Row]
    tail: list[str] = field(default_factory=list)  # a closing border, "(500 rows)"

    def num_lines(self) -> int:
        return len(self.head) + sum(row.text.count("\n") + 1 for row in self.rows) + len(self.tail)


@dataclass(slots=True)
class Row:
    text: str  # the original line (lines, for a grid box's multi-line row)
    cells: list[str]


Layout = list[str | Table]  # tables and the lines between them, in order


def _enough(layout: Layout, num_nonblank: int, share: float) -> bool:
    tables = [seg for seg in layout if isinstance(seg, Table)]
    if not any(len(t.rows) >= _MIN_ROWS for t in tables):
        return False
    return sum(t.num_lines() for t in tables) >= share * num_nonblank


def _boxes(lines: list[str], num_nonblank: int) -> Layout | None:
    """Boxes (``+---+``, box-drawing), psql's ``---+---`` and markdown ``|---|`` tables."""
    layout: Layout = []
    i, n = 0, len(lines)
    found = False
    while i < n:
        line = lines[i]
        table: Table | None = None
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


def _box(lines: list[str], start: int) -> tuple[Table | None, int]:
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
    rows: list[Row] = []
    if not any(body_border):
        rows = [Row(line, _box_cells(line)) for line in body]
    else:  # a grid: a border after every row, whose cells may take several lines
        group: list[str] = []
        for line, border in zip(body, body_border, strict=True):
            group.append(line)
            if border:
                rows.append(Row("\n".join(group), _box_cells(group[0])))
                group = []
        if group:
            rows.append(Row("\n".join(group), _box_cells(group[0])))
    while end < len(lines) and _ROWS_FOOTER.match(lines[end]):
        tail.append(lines[end])
        end += 1
    if len(names) < 2 or not rows:
        return None, start
    return Table("table", head, names, rows, tail), end


def _box_cells(line: str) -> list[str]:
    if "|" in line:  # the common case, without the box-drawing bars
        return [cell.strip() for cell in line.strip().split("|")[1:-1]]
    return [cell.strip() for cell in _BOX_BAR.split(line.strip())[1:-1]]


def _psql(lines: list[str], start: int) -> tuple[Table | None, int]:
    names = [cell.strip() for cell in lines[start].split("|")]
    end = start + 2
    rows = []
    while end < len(lines) and "|" in lines[end] and not _ROWS_FOOTER.match(lines[end]):
        rows.append(Row(lines[end], [cell.strip() for cell in lines[end].split("|")]))
        end += 1
    tail = []
    if end < len(lines) and _ROWS_FOOTER.match(lines[end]):
        tail.append(lines[end])
        end += 1
    return Table("table", lines[start : start + 2], names, rows, tail), end


def _markdown(lines: list[str], start: int) -> tuple[Table | None, int]:
    names = _markdown_cells(lines[start])
    end = start + 2
    rows = []
    while end < len(lines) and lines[end].strip() and _MD_BAR.search(lines[end]):
        rows.append(Row(lines[end], _markdown_cells(lines[end])))
        end += 1
    if len(names) < 2:
        return None, start
    return Table("table", lines[start : start + 2], names, rows), end


def _markdown_cells(line: str) -> list[str]:
    line = line.strip()
    if "\\|" not in line:  # no escaped bars: a plain split
        return [cell.strip() for cell in line.removeprefix("|").removesuffix("|").split("|")]
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") and not line.endswith("\\|") else line
    return [cell.strip() for cell in _MD_BAR.split(line)]


def _aligned(lines: list[str], num_nonblank: int) -> Layout | None:
    """Columns aligned with spaces under a header of words (kubectl, docker, ps, df)."""
    layout: Layout = []
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


def _aligned_block(block: list[str]) -> tuple[list[str], Table] | None:
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
        if spans is not None:
            names = [_slice(header, spans, c) for c in range(len(spans))]
            cuts = [end for _, end in spans[:-1]]
            bounds = list(zip([0, *cuts], [*cuts, None], strict=True))
            rows = [
                Row(block[i], [] if i in inner_rules else _cells(expanded[i], spans, cuts, bounds))
                for i in range(body_start, stop)
            ]
        else:  # values wider than their column push the rest right (ps aux's VSZ, RSS)
            names = header.split()
            rows = [
                Row(block[i], [] if i in inner_rules else _split_cells(expanded[i], len(names)))
                for i in range(body_start, stop)
            ]
            if len(names) < 3 or not _split_evenly(rows):
                continue
        cells = [row for row in rows if row.cells]
        if not _consistent(cells, len(names)) or not _unlike_rows(names, cells):
            continue
        return block[:h], Table("table", block[h:body_start], names, rows, block[stop:])
    return None


def _split_cells(line: str, num_columns: int) -> list[str]:
    """A row split at its spaces, the last column taking the rest (a command and its
    arguments); a row of fewer words is padded with empty cells."""
    cells = line.split(None, num_columns - 1)
    return cells + [""] * (num_columns - len(cells))


def _split_evenly(rows: list[Row]) -> bool:
    """Whether nearly every row has a word for each column: the header's words name them."""
    filled = [row for row in rows if row.cells]
    return sum(1 for row in filled if row.cells[-1]) * 10 >= 9 * len(filled)


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


def _unlike_rows(names: list[str], rows: list[Row]) -> bool:
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


def _consistent(rows: list[Row], num_columns: int) -> bool:
    """Most rows fill most columns, the first one above all (a row's name)."""
    firsts = sum(1 for row in rows if row.cells[0])
    filled = sum(len(row.cells) - row.cells.count("") for row in rows)
    return firsts * 10 >= 8 * len(rows) and filled * 2 >= len(rows) * num_columns


def _delimited(text: str, lines: list[str], num_nonblank: int) -> Layout | None:
    """CSV and TSV: one delimiter splits most rows into the same number of short fields.
    Of several, the one that splits the header as it splits the rows, into the most
    fields: ``;`` where ``,`` is the decimal point."""
    sample = [line for line in lines[: _SAMPLE_LINES * 2] if line.strip()][:_SAMPLE_LINES]
    candidates = []
    for candidate in "\t,;|":
        if sum(candidate in line for line in sample) * 10 < 8 * len(sample):
            continue
        try:
            split = [len(fields) for fields in csv.reader(sample, delimiter=candidate)]
        except csv.Error:
            continue
        width, num = Counter(split).most_common(1)[0]
        if width >= (3 if candidate == "|" else 2) and num * 10 >= 8 * len(split):
            candidates.append((split[0] == width, width, candidate))
    for *_, delimiter in sorted(candidates, reverse=True):
        table = _delimited_table(text, delimiter)
        if table is not None and _enough([table], num_nonblank, 0.9):
            return [table]
    return None


def _delimited_table(text: str, delimiter: str) -> Table | None:
    rows = _csv_rows(text, delimiter)
    if rows is None or len(rows) < _MIN_ROWS + 1:
        return None
    width, num = Counter(len(row.cells) for row in rows).most_common(1)[0]
    if num * 20 < 17 * len(rows) or _prose(rows, width):
        return None
    first = rows[0].cells
    header = len(first) == width and not any(quantity(cell) for cell in first)
    if not header and width == 2 and _sizes_of_paths(rows):
        return None
    names = first if header else [f"column {i + 1}" for i in range(width)]
    kind = "tsv" if delimiter == "\t" else "csv"
    head = [rows[0].text] if header else []
    return Table(kind, head, names, rows[1:] if header else rows)


def _sizes_of_paths(rows: list[Row]) -> bool:
    """Sizes or counts beside paths, without a header: a listing (``du``, ``wc -l``)."""
    sample = [row.cells for row in rows[:_SAMPLE_LINES]]
    sized = sum(1 for cells in sample if len(cells) == 2 and quantity(cells[0]) is not None)
    pathy = sum(1 for cells in sample if len(cells) == 2 and ("/" in cells[1] or "." in cells[1]))
    return sized * 10 >= 8 * len(sample) and pathy * 10 >= 8 * len(sample)


def _csv_rows(text: str, delimiter: str) -> list[Row] | None:
    lines = text.splitlines(keepends=True)
    reader = csv.reader(lines, delimiter=delimiter)
    rows = []
    done = 0
    try:
        for fields in reader:
            source = "".join(lines[done : reader.line_num]).rstrip("\r\n")
            done = reader.line_num
            if fields and source.strip():
                rows.append(Row(source, [f.strip() for f in fields]))
    except csv.Error:
        return None
    return rows


def _prose(rows: list[Row], width: int) -> bool:
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
