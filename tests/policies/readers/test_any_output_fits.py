"""Whatever a tool prints, structured or not, the summarizer's result fits its budget.

Random outputs of every structure the readers know (JSON documents and lines, delimited
and aligned tables, diffs, test runs, tracebacks, logs, listings, search hits, pages and
prose), damaged at random, reduced with random arguments and questions: each result is
within its budget by the counter's exact count, and every reader either reads the text
or leaves it to the next.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from governor import TokenCounter
from policies import ExtractiveSummarizer

COUNTER = TokenCounter()
SUMMARIZER = ExtractiveSummarizer(COUNTER)

_WORD = st.text(alphabet="abcdefgxyz_ERROR0123456789.-/", min_size=1, max_size=12)
_VALUE = st.one_of(
    st.integers(-5, 10**9), st.floats(allow_nan=False), _WORD, st.booleans(), st.none()
)
_RECORD = st.dictionaries(st.sampled_from(["id", "status", "name", "error", "amount"]), _VALUE)


def _json(records: list[dict[str, object]], lines: bool) -> str:
    if lines:
        return "\n".join(json.dumps(r) for r in records)
    return json.dumps({"data": records, "has_more": False}, indent=2)


def _table(rows: list[list[str]], sep: str) -> str:
    return "\n".join(sep.join(row) for row in [["host", "disk_pct", "state"], *rows])


def _diff(changes: list[str]) -> str:
    body = [f"{'+-'[k % 2]}{c}" for k, c in enumerate(changes)]
    old = sum(1 for b in body if b[0] == "-")
    return (
        f"diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,{old} +1,{len(body) - old} @@\n"
        + "\n".join(body)
    )


def _log(messages: list[str]) -> str:
    levels = ["INFO", "WARN", "ERROR", "DEBUG"]
    return "\n".join(
        f"2026-03-04T10:00:{k % 60:02d}Z {levels[k % 4]} {m}" for k, m in enumerate(messages)
    )


def _run(names: list[str]) -> str:
    lines = [
        f"tests/test_{n}.py::test_{k} {'FAILED' if k % 5 == 0 else 'PASSED'}"
        for k, n in enumerate(names)
    ]
    return "\n".join([*lines, f"=== {len(names) // 5} failed, {len(names)} passed in 1.2s ==="])


def _trace(frames: list[str]) -> str:
    body = [f'  File "/app/{f}.py", line {k}, in f{k}\n    call()' for k, f in enumerate(frames)]
    return "\n".join(["Traceback (most recent call last):", *body, "ValueError: bad input"])


def _listing(paths: list[str]) -> str:
    return "\n".join(f"./src/{p}/{k}.py" for k, p in enumerate(paths))


def _hits(texts: list[str]) -> str:
    return "\n".join(f"src/{t}.py:{k}:    value = {t}" for k, t in enumerate(texts))


def _page(sentences: list[str]) -> str:
    return (
        "<html><body>"
        + "".join(f"<p>{s}. More words here.</p>" for s in sentences)
        + "</body></html>"
    )


_STRUCTURED = st.one_of(
    st.builds(_json, st.lists(_RECORD, min_size=1, max_size=60), st.booleans()),
    st.builds(
        _table,
        st.lists(st.lists(_WORD, min_size=3, max_size=3), max_size=80),
        st.sampled_from([",", "\t", " | "]),
    ),
    st.builds(_diff, st.lists(_WORD, min_size=1, max_size=60)),
    st.builds(_log, st.lists(_WORD, min_size=1, max_size=80)),
    st.builds(_run, st.lists(_WORD, min_size=1, max_size=80)),
    st.builds(_trace, st.lists(_WORD, min_size=1, max_size=30)),
    st.builds(_listing, st.lists(_WORD, min_size=1, max_size=80)),
    st.builds(_hits, st.lists(_WORD, min_size=1, max_size=80)),
    st.builds(_page, st.lists(_WORD, min_size=1, max_size=40)),
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    text=_STRUCTURED,
    cut=st.integers(0, 10_000),
    noise=st.text(max_size=40),
    budget=st.integers(1, 200),
    argument=_WORD,
    question=st.text(max_size=60),
)
def test_any_output_fits_its_budget(
    text: str, cut: int, noise: str, budget: int, argument: str, question: str
) -> None:
    for damaged in (text, text[: cut % (len(text) + 1)] + noise):
        result = SUMMARIZER.reduce(
            damaged, budget_tokens=budget, arguments={"q": argument}, question=question
        )
        assert (
            result.tokens_after == COUNTER.count(result.text) <= max(budget, result.tokens_before)
        )
        if result.tokens_before > budget:
            assert result.tokens_after <= budget and result.method != "none"
        kept = SUMMARIZER.gist(
            damaged, budget_tokens=budget, arguments={"q": argument}, question=question
        )
        assert COUNTER.count(kept) <= budget  # a gist, for a summary of many outputs
