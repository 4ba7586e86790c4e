"""``fit``: pieces kept by rank under the budget, every left-out run marked with what it held."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from governor import TokenCounter
from policies.readers import Piece, Query, Reading, Tier, fit, gist

COUNTER = TokenCounter()
# Pieces of any text, tier and order within it.
PIECES = st.lists(
    st.tuples(st.text(min_size=0, max_size=80), st.integers(0, 5), st.integers(0, 9)),
    min_size=1,
    max_size=40,
)


def rows(n: int, asked: int) -> Reading:
    header = Piece("id | status | amount", (Tier.SHAPE, 0))
    body = [
        Piece(f"{i} | {'refunded' if i == asked else 'paid'} | {i * 3}.00", rank, "rows")
        for i in range(n)
        for rank in [(Tier.ASKED, 0) if i == asked else (Tier.REST, i)]
    ]
    return Reading("table", (header, *body))


def test_the_shape_and_the_asked_row_come_first_and_every_gap_is_marked() -> None:
    reading = rows(400, asked=271)
    fitted = fit(reading, 60, COUNTER)
    assert fitted is not None and fitted.tokens == COUNTER.count(fitted.text) <= 60
    lines = fitted.text.split("\n")
    assert lines[0] == "id | status | amount"
    assert "271 | refunded | 813.00" in lines
    kept_rows = [line for line in lines[1:] if not line.startswith("[...")]
    # The rest by rank (first rows first), and the markers account for every left-out row.
    assert kept_rows[0] == "0 | paid | 0.00"
    elided = sum(
        int(n.replace(",", "")) for n in re.findall(r"\[\.\.\. ([\d,]+) rows?", fitted.text)
    )
    assert elided == 400 - len(kept_rows) == dict(fitted.elided)["rows"]


def test_a_marker_counts_the_tokens_it_stands_for() -> None:
    reading = Reading(
        "x",
        (
            Piece("kept", (Tier.SHAPE,)),
            Piece("word " * 30, (Tier.REST,), "lines", 9, folded=8, tokens=123),
        ),
    )
    fitted = fit(reading, 20, COUNTER)
    assert fitted is not None
    assert fitted.text == "kept\n[... 9 lines (123 tokens) elided ...]"


def test_folded_pieces_kept_are_reported_as_similar() -> None:
    reading = Reading("x", (Piece("run\n[... 39 similar]", (Tier.REST,), "lines", 40, 39, 400),))
    fitted = fit(reading, 100, COUNTER)
    assert fitted is not None and fitted.elided == (("similar lines", 39),)


def test_nothing_fits_is_none() -> None:
    reading = Reading("x", (Piece("word " * 200, (Tier.SHAPE,)),))
    assert fit(reading, 10, COUNTER) is None
    assert fit(Reading("x", ()), 10, COUNTER) is None


@settings(max_examples=60, deadline=None)
@given(
    PIECES,
    st.integers(1, 120),
)
def test_never_over_budget(parts: list[tuple[str, int, int]], budget: int) -> None:
    pieces = tuple(Piece(text, (tier, order)) for text, tier, order in parts)
    fitted = fit(Reading("x", pieces), budget, COUNTER)
    if fitted is not None:
        assert fitted.tokens == COUNTER.count(fitted.text) <= budget


def test_query_terms_and_words() -> None:
    query = Query.of(
        "read_file", {"path": "src/app/models.py", "limit": 40}, "Why does the User model fail?"
    )
    assert {"src/app/models.py", "models.py"} <= set(query.terms)
    assert query.mentions("  File src/app/models.py, line 3")
    assert {"user", "model", "fail"} == query.words - {"src", "app", "py", "40", "read", "file"}


def test_a_marker_never_counts_nothing() -> None:
    reading = Reading(
        "x",
        (
            Piece("kept", (Tier.SHAPE,)),
            Piece("[files: a.py +1 -0]", (Tier.REST,), "files", 0),
            Piece("word " * 40, (Tier.REST,), "lines", 3),
        ),
    )
    fitted = fit(reading, 20, COUNTER)
    assert fitted is not None and "0 files" not in fitted.text and "3 lines (" in fitted.text


def test_a_gist_is_the_first_ranked_pieces_without_shape_or_markers() -> None:
    reading = Reading(
        "x",
        (
            Piece("[log: 400 entries, 2 errors]", (Tier.SHAPE, 0)),
            Piece("INFO started", (Tier.CONTEXT, 1)),
            Piece("[... 12 lines (80 tokens) elided ...]", (Tier.REST, 0)),
            Piece("   ", (Tier.ALARM, 0)),
            Piece("ERROR db: connection refused", (Tier.ALARM, 1)),
            Piece("WARN slow query 812 ms", (Tier.STANDOUT, 0)),
        ),
    )
    # Most telling first, so a shorter gist is its first lines.
    assert gist(reading, 200, COUNTER) == (
        "ERROR db: connection refused\nWARN slow query 812 ms\nINFO started"
    )
    tight = COUNTER.count("ERROR db: connection refused\nWARN slow query 812 ms")
    assert gist(reading, tight, COUNTER) == "ERROR db: connection refused\nWARN slow query 812 ms"
    # The first piece cut to the budget where it alone does not fit.
    assert gist(reading, 2, COUNTER) == COUNTER.truncate("ERROR db: connection refused", 2)
    assert gist(Reading("x", reading.pieces[:3]), 1, COUNTER) == "INFO"
    assert gist(Reading("x", reading.pieces[:1]), 100, COUNTER) is None


@settings(max_examples=60, deadline=None)
@given(
    PIECES,
    st.integers(1, 120),
)
def test_a_gist_is_never_over_budget(parts: list[tuple[str, int, int]], budget: int) -> None:
    pieces = tuple(Piece(text, (tier, order)) for text, tier, order in parts)
    kept = gist(Reading("x", pieces), budget, COUNTER)
    if kept is not None:
        assert COUNTER.count(kept) <= budget
