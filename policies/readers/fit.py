"""Fitting a reading to a token budget: pieces kept by rank, every left-out run marked.

``fit`` keeps the pieces of a ``Reading`` in rank order while their estimated cost fits,
shows the kept ones in reading order, and puts one marker in place of each run of
left-out pieces, saying what the run held: ``[... 480 rows (12,034 tokens) elided ...]``.
A piece that folds a run of similar ones is shown as its first and a marker
(``[... 39 similar lines (410 tokens) elided ...]``). The estimate (each piece's own
tokens plus a newline, and the widest marker per gap) is
checked by counting the rendered text exactly; when it is over, the lowest-ranked kept
pieces go until it fits, and room left once the exact count is known is filled again.
The result never exceeds the budget by the counter's exact count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from governor import TokenCounter
from policies.readers.pieces import Piece, Reading, Tier

__all__ = ["Fitted", "fit", "gist", "marker"]

_REFILLS = 2  # passes that fill the room left once the exact count is known
# An earlier reduction's shape line (``[prose: 7 headings, 80 sentences]``) or marker.
_ANNOTATION = re.compile(r"\[(?:[a-z][a-z -]*: [^\]]*|\.\.\. .* elided \.\.\.)\]")
_SINGULAR = {"entries": "entry", "matches": "match", "similar lines": "similar line"}


@dataclass(frozen=True, slots=True)
class Fitted:
    """A reading brought under a budget: its text, exact tokens, and what was left out as
    ``(what, count)`` pairs (folded runs first, as ``("similar lines", 39)``)."""

    text: str
    tokens: int
    elided: tuple[tuple[str, int], ...]


def fit(reading: Reading, budget: int, counter: TokenCounter) -> Fitted | None:
    """The reading under ``budget`` tokens, or None when no piece fits beside its markers."""
    pieces = reading.pieces
    if not pieces:
        return None
    shown, tokens, costs = _measure(pieces, counter)
    totals: dict[str, int] = {}
    for piece in pieces:
        totals[piece.what] = totals.get(piece.what, 0) + piece.count
    # The widest marker any gap can need: no gap holds more than the whole reading.
    widest = counter.count(marker(totals, sum(tokens)))
    selected = [False] * len(pieces)
    order = sorted(range(len(pieces)), key=lambda i: pieces[i].rank)
    _select(costs, selected, order, widest, budget - widest)
    kept = [i for i in order if selected[i]]
    best: tuple[str, int, list[bool]] | None = None
    refills = 0
    while True:
        rendered = _render(pieces, shown, tokens, selected)
        used = counter.count(rendered)
        if used <= budget:
            best = (rendered, used, selected.copy())
            if refills == _REFILLS or not _select(costs, selected, order, widest, budget - used):
                break
            refills += 1
            continue
        if best is not None:  # a refill overshot: the last selection that fitted stands
            break
        if not kept:
            return None
        freed = 0
        while kept and freed < used - budget:  # the lowest-ranked kept pieces go first
            i = kept.pop()
            selected[i] = False
            freed += costs[i]
    rendered, used, selected = best
    if not any(selected):
        return None  # only markers
    return Fitted(rendered, used, _elided(pieces, selected))


def gist(reading: Reading, budget: int, counter: TokenCounter) -> str | None:
    """The reading's most telling pieces within ``budget`` tokens, for a summary that
    holds many outputs at once: pieces in rank order up to the first that does not fit
    (the first itself cut to the budget where it alone does not), shown in that order so
    that a shorter gist is its first lines; no shape pieces and no markers (the summary
    says what it stands for), a folded run as its first piece. None where the reading
    has no piece of its own to show."""
    pieces = reading.pieces
    order = sorted(
        (i for i, piece in enumerate(pieces) if piece.rank[0] != Tier.SHAPE and _telling(piece)),
        key=lambda i: pieces[i].rank,
    )
    if not order:
        return None
    kept: list[str] = []
    used = -1  # a newline between pieces, none after the last
    for i in order:
        cost = counter.count(pieces[i].text) + 1
        if used + cost > budget:
            break
        kept.append(pieces[i].text)
        used += cost
    while kept:  # the estimate checked by counting the text exactly
        text = "\n".join(kept)
        if counter.count(text) <= budget:
            return text
        kept.pop()
    return counter.truncate(pieces[order[0]].text, budget)


def _telling(piece: Piece) -> bool:
    """Whether a piece says something of its own: not blank, not an earlier reduction's
    shape line or marker (or a piece of one) read back as text."""
    text = piece.text.strip()
    return bool(text) and not text.startswith("[...") and _ANNOTATION.fullmatch(text) is None


def marker(counts: dict[str, int], tokens: int) -> str:
    """``[... 480 rows, 3 lines (12,034 tokens) elided ...]``."""
    parts = ", ".join(f"{n:,} {_name(what, n)}" for what, n in counts.items() if n)
    return (
        f"[... {parts} ({tokens:,} tokens) elided ...]"
        if parts
        else f"[... {tokens:,} tokens elided ...]"
    )


def _name(what: str, n: int) -> str:
    if n != 1 or not what.endswith("s"):
        return what
    return _SINGULAR.get(what, what[:-1])


def _measure(
    pieces: tuple[Piece, ...], counter: TokenCounter
) -> tuple[list[str], list[int], list[int]]:
    """Each piece's text as shown (a folded run with its marker), its tokens when left out
    (what it stands for), and its cost when kept (its shown text and a newline)."""
    seen: dict[str, int] = {}  # logs repeat lines: count each distinct text once

    def count(text: str) -> int:
        n = seen.get(text, -1)
        if n < 0:
            n = seen[text] = counter.count(text)
        return n

    shown, stands_for, costs = [], [], []
    for piece in pieces:
        if not piece.folded:
            own = piece.tokens if piece.tokens is not None else count(piece.text)
            shown.append(piece.text)
            stands_for.append(own)
            costs.append(own + 1)
            continue
        whole = piece.tokens if piece.tokens is not None else count(piece.source or piece.text)
        rest = max(0, whole - count(piece.text))
        text = f"{piece.text}\n{marker({f'similar {piece.what}': piece.folded}, rest)}"
        shown.append(text)
        stands_for.append(whole)
        costs.append(counter.count(text) + 1)
    return shown, stands_for, costs


def _select(
    costs: list[int], selected: list[bool], order: list[int], widest: int, room: int
) -> int:
    """Select pieces in rank order while their estimated cost fits in ``room``: tokens and a
    newline, and one ``widest`` marker per run of left-out pieces. Returns how many."""
    added = 0
    last = len(costs) - 1
    for i in order:
        if selected[i]:
            continue
        left_open = i > 0 and not selected[i - 1]
        right_open = i < last and not selected[i + 1]
        gaps = 1 if left_open and right_open else -1 if not (left_open or right_open) else 0
        cost = costs[i] + gaps * widest
        if cost <= room:
            selected[i] = True
            room -= cost
            added += 1
    return added


def _render(
    pieces: tuple[Piece, ...], shown: list[str], tokens: list[int], selected: list[bool]
) -> str:
    out: list[str] = []
    gap: dict[str, int] = {}
    gap_tokens = 0
    for piece, text, n, keep in zip(pieces, shown, tokens, selected, strict=True):
        if keep:
            if gap:
                out.append(marker(gap, gap_tokens))
                gap, gap_tokens = {}, 0
            out.append(text)
        else:
            gap[piece.what] = gap.get(piece.what, 0) + piece.count
            gap_tokens += n
    if gap:
        out.append(marker(gap, gap_tokens))
    return "\n".join(out)


def _elided(pieces: tuple[Piece, ...], selected: list[bool]) -> tuple[tuple[str, int], ...]:
    folded: dict[str, int] = {}
    left_out: dict[str, int] = {}
    for piece, keep in zip(pieces, selected, strict=True):
        if keep:
            if piece.folded:
                what = f"similar {piece.what}"
                folded[what] = folded.get(what, 0) + piece.folded
        else:
            left_out[piece.what] = left_out.get(piece.what, 0) + piece.count
    return (*folded.items(), *left_out.items())
