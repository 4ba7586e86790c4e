"""Tables that stay readable at any width: a narrow terminal, or 80 columns when piped.

``print_table`` prints a rich ``Table`` as it is when every header, name and figure fits
whole; else with rows and columns swapped (a table of a few wide rows reads well turned);
else one block per row. Used by every table the CLI prints.
"""

from __future__ import annotations

from rich.console import Console
from rich.protocol import is_renderable
from rich.table import Table
from rich.text import Text

__all__ = ["MIN_NOTE", "print_table"]

MIN_NOTE = 24  # a note column narrower than this is a column of word fragments


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` with every header, name and figure whole, at any width (a narrow
    terminal, or 80 columns when piped): as it is when it fits; else with rows and
    columns swapped (a table of a few wide rows); else one block per row."""
    width = console.width
    if _needed_width(console, table) <= width:
        console.print(table)
        return
    swapped = _transposed(table)
    if _needed_width(console, swapped) <= width:
        console.print(swapped)
        return
    for title, block in _blocks(table):
        console.print(Text(_plain(title), style="bold"), block, "")
    if table.caption is not None:
        console.print(table.caption)


def _plain(cell: object) -> str:
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(cell).plain if isinstance(cell, str) else str(cell)


def _needed_width(console: Console, table: Table) -> int:
    """The width at which no column wraps or cuts a cell, but a column with a ``ratio``
    (free text) wraps down to its ``min_width``."""
    natural = needed = 0
    for column in table.columns:
        lines = [
            line for cell in [column.header, *column.cells] for line in _plain(cell).splitlines()
        ]
        width = max((Text(line).cell_len for line in lines), default=0)
        natural += width
        needed += min(width, column.min_width or 0) if column.ratio else width
    whole = console.measure(table, options=console.options.update(width=100_000)).maximum
    return whole - natural + needed  # padding and rules, plus the columns' widths


def _transposed(table: Table) -> Table:
    """Each row a column (headed by its first cell), each column a row."""
    first, *rest = table.columns
    swapped = Table(
        box=table.box,
        pad_edge=table.pad_edge,
        title=table.title,
        caption=table.caption,
        caption_justify=table.caption_justify,
    )
    swapped.add_column(_plain(first.header))
    for cell in first.cells:
        swapped.add_column(_plain(cell), justify="right")
    for column in rest:
        swapped.add_row(column.header, *column.cells)
    return swapped


def _blocks(table: Table) -> list[tuple[object, Table]]:
    """Per row, its first cell (a title) and a two-column table: each other column's
    header and the row's value, which wraps."""
    first, *rest = table.columns
    blocks: list[tuple[object, Table]] = []
    for i, title in enumerate(first.cells):
        block = Table.grid(padding=(0, 2))
        block.add_column(style="dim", no_wrap=True)
        block.add_column(overflow="fold")
        for column in rest:
            value = list(column.cells)[i]
            if is_renderable(value) and _plain(value):
                block.add_row(column.header, value)
        blocks.append((title, block))
    return blocks
