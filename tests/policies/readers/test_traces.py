"""``read_traces``: under a small budget, what was raised (the chain's causes included) and
where in the user's code; the library frames and other goroutines folded and counted."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor import TokenCounter
from policies.readers import Query, Tier, fit
from policies.readers.traces import read_traces
from tests.policies.readers import trace_outputs as outputs
from tests.policies.readers.samples import others

COUNTER = TokenCounter()
NO_QUERY = Query.of()


def kept_lines(text: str, budget: int, query: Query = NO_QUERY) -> list[str]:
    reading = read_traces(text, query)
    assert reading is not None and reading.method == "traces"
    fitted = fit(reading, budget, COUNTER)
    assert fitted is not None and fitted.tokens == COUNTER.count(fitted.text) <= budget
    return fitted.text.split("\n")


@pytest.mark.parametrize("seed", range(3))
def test_python_keeps_the_chain_and_the_innermost_user_frames(seed: int) -> None:
    text = outputs.python_log(seed)
    assert COUNTER.count(text) > 3_000
    lines = text.split("\n")
    kept = kept_lines(text, 250)
    raised = [line for line in lines if re.match(r"[\w.]+(Error|Exception): ", line)]
    assert len(raised) == 2 and set(raised) <= set(kept)  # the cause and the one raised
    assert next(line for line in lines if " ERROR " in line) in kept  # the entry above it
    innermost = '  File "/app/billing/invoice.py", line 41, in invoice_total'
    assert innermost in kept
    assert lines[lines.index(innermost) + 1] in kept  # its source line
    assert not any("site-packages" in line for line in kept)
    assert re.search(r"\[\.\.\. .*\d+ frames? ", "\n".join(kept))  # counted, not dropped


@pytest.mark.parametrize("seed", range(3))
def test_java_keeps_every_cause_and_folds_the_framework_frames(seed: int) -> None:
    text = outputs.java_log(seed)
    assert COUNTER.count(text) > 3_000
    lines = text.split("\n")
    kept = kept_lines(text, 250)
    headline = "com.acme.orders.OrderLookupException: could not load order ord_77001"
    causes = [line for line in lines if line.startswith("Caused by: ")]
    assert len(causes) == 2 and {headline, *causes} <= set(kept)
    assert "\tat com.acme.orders.OrderService.find(OrderService.java:88)" in kept
    assert "\tat com.acme.orders.OrderRepository.load(OrderRepository.java:57)" in kept
    reading = read_traces(text, NO_QUERY)
    assert reading is not None
    # Every frame outside com.acme is folded, and each run counts its "at" lines.
    folded = [p for p in reading.pieces if p.what == "frames"]
    for piece in folded:
        assert piece.count == max(1, piece.text.count("\tat "))
    library = sum(1 for line in lines if line.startswith("\tat ") and "com.acme" not in line)
    assert sum(p.text.count("\tat ") for p in folded) == library


@pytest.mark.parametrize("seed", range(3))
def test_node_keeps_the_error_its_source_line_and_the_app_frame(seed: int) -> None:
    text = outputs.node_log(seed)
    assert COUNTER.count(text) > 3_000
    kept = kept_lines(text, 150)
    error = "TypeError: Cannot read properties of undefined (reading 'reduce')"
    frame = "    at cartTotal (/app/src/routes/cart.js:57:30)"
    assert {error, frame, "/app/src/routes/cart.js:57"} <= set(kept)
    assert not any("node_modules" in line for line in kept)


@pytest.mark.parametrize("seed", range(3))
def test_go_keeps_the_panic_and_its_goroutine_and_counts_the_others(seed: int) -> None:
    text = outputs.go_dump(seed)
    assert COUNTER.count(text) > 3_000
    lines = text.split("\n")
    kept = kept_lines(text, 200)
    assert "panic: assignment to entry in nil map" in kept
    at = lines.index("\t/src/shop/cart/store.go:64 +0x1a5")
    assert {lines[at - 1], lines[at]} <= set(kept)  # the innermost user frame
    others_ = sum(1 for line in lines[3:] if line.startswith("goroutine "))
    marker = re.search(r"\[\.\.\. .*?(\d+) goroutines", "\n".join(kept))
    assert marker is not None and int(marker.group(1)) == others_


def test_a_repeated_trace_adds_its_message_after_the_first_ones_frames() -> None:
    text = outputs.repeated_python(2)
    reading = read_traces(text, NO_QUERY)
    assert reading is not None
    assert reading.pieces[0].text == (
        "[traces: 12 (httpx.ReadTimeout 11, sqlite3.OperationalError 1)]"
    )
    timeouts = [p for p in reading.pieces if p.text == "httpx.ReadTimeout: timed out"]
    assert len(timeouts) == 11
    assert timeouts[0].rank[0] == Tier.ALARM
    assert all(p.rank[0] == Tier.CONTEXT for p in timeouts[1:])
    frame = next(p for p in reading.pieces if p.text.startswith('  File "/app/sync/pull.py"'))
    assert frame.rank < timeouts[1].rank
    kept = kept_lines(text, 250)
    assert "sqlite3.OperationalError: database is locked" in kept
    assert '  File "/app/sync/store.py", line 12, in save' in kept


def test_a_log_line_naming_the_call_is_asked_for() -> None:
    text = outputs.python_log(3)
    line = next(line for line in text.split("\n") if "GET /orders/131 " in line)
    query = Query.of("logs", {"search": "/orders/131"})
    reading = read_traces(text, query)
    assert reading is not None
    piece = next(p for p in reading.pieces if p.text == line)
    assert piece.rank[0] == Tier.ASKED
    assert line in kept_lines(text, 250, query)


@pytest.mark.parametrize("seed", range(2))
def test_text_without_a_trace_is_not_read(seed: int) -> None:
    for kind, text in others(seed).items():
        assert read_traces(text, NO_QUERY) is None, kind
    prose = (
        "When it crashes, Python prints Traceback (most recent call last): and the frames.\n"
        "    at the end of the day we meet (room 4)\n"
        "goroutine leaks are common in servers\n"
        "2026-03-04 10:00:00 ERROR orders - payment failed: card declined\n"
    )
    assert read_traces(prose, NO_QUERY) is None


def test_a_single_at_line_is_not_a_trace() -> None:
    text = "deploy started\n    at /srv/app:1:1\ndeploy done"
    assert read_traces(text, NO_QUERY) is None


TRACE_LINES = (
    "Traceback (most recent call last):",
    '  File "/app/x.py", line 3, in f',
    '  File "/usr/lib/python3.11/site-packages/y.py", line 9, in g',
    "    return g()",
    "ValueError: bad",
    "During handling of the above exception, another exception occurred:",
    "java.lang.IllegalStateException: boom",
    "\tat com.acme.Foo.bar(Foo.java:42)",
    "\tat java.base/java.lang.Thread.run(Thread.java:1583)",
    "Caused by: java.io.IOException: disk",
    "\t... 3 more",
    "TypeError: x is not a function",
    "    at Object.<anonymous> (/app/a.js:1:2)",
    "    at node:internal/main/run_main_module:23:47",
    "panic: boom",
    "goroutine 1 [running]:",
    "main.main()",
    "\t/app/main.go:10 +0x1d",
    "2026-03-04 10:00:00 ERROR x",
    "",
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(TRACE_LINES) | st.text(max_size=30), max_size=60),
    st.integers(min_value=20, max_value=400),
)
def test_never_raises_and_fits_on_trace_like_text(lines: list[str], budget: int) -> None:
    text = "\n".join(lines)
    reading = read_traces(text, Query.of("logs", {"q": "Foo.java"}))
    if reading is None:
        return
    source = {line.rstrip() for line in text.splitlines()}
    for piece in reading.pieces:
        assert piece.text and not piece.text.endswith("\n")
        if piece.rank[0] != Tier.SHAPE:
            assert set(piece.text.split("\n")) <= source
    fitted = fit(reading, budget, COUNTER)
    assert fitted is None or fitted.tokens <= budget


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.integers(min_value=1, max_value=300))
def test_never_raises_on_arbitrary_text(text: str, budget: int) -> None:
    reading = read_traces(text, NO_QUERY)
    if reading is not None:
        fitted = fit(reading, budget, COUNTER)
        assert fitted is None or fitted.tokens <= budget
