"""The tool-output corpus: seeded, realistic as each format, and every fact planted once, in
atomic needles, at a place drawn over the whole output.

What a wrong figure of ``kvgov bench reduce`` would rest on is checked here from the text
itself: a needle missing or formatting-dependent would score a faithful reduction as a
loss; needles that co-occur elsewhere would score a lucky one as a win; facts bunched at
the start or end would favour truncation.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import time
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from typing import Any

import pytest

from governor import TokenCounter
from policies.benchmarks.tool_outputs import (
    EVALUATION_SEEDS,
    FORMATS,
    KINDS,
    REASONS,
    TUNING_SEED,
    Case,
    Fact,
    build_cases,
)

_ONE_RECORD_PER_LINE = {"jsonl", "csv", "table", "log"}


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return [case for seed in EVALUATION_SEEDS for case in build_cases(seed)]


def test_the_seed_decides_everything() -> None:
    assert build_cases(3) == build_cases(3)
    other = build_cases(4)
    assert all(a.text != b.text for a, b in zip(build_cases(3), other, strict=True))
    # A case depends on its seed, kind and index only: fewer per kind is a prefix of more.
    assert build_cases(5, per_kind=1) == build_cases(5, per_kind=2)[::2]
    assert [c.kind for c in build_cases(5, per_kind=1)] == list(KINDS)
    with pytest.raises(ValueError, match="per_kind"):
        build_cases(1, per_kind=0)


def test_the_tuning_seed_is_never_an_evaluation_seed() -> None:
    assert TUNING_SEED not in EVALUATION_SEEDS
    assert len(set(EVALUATION_SEEDS)) == len(EVALUATION_SEEDS) >= 10


def test_kinds_and_their_formats(cases: list[Case]) -> None:
    assert len(KINDS) >= 12
    seen: dict[str, set[str]] = {kind: set() for kind in KINDS}
    for case in cases:
        assert case.format in FORMATS[case.kind], case.format
        seen[case.kind].add(case.format)
    for kind, formats in seen.items():
        assert len(formats) >= 2, (kind, formats)


def test_each_case_is_a_tool_call_an_agent_makes(cases: list[Case]) -> None:
    reasons = set()
    for case in cases:
        assert case.tool_name and case.question.strip() and case.arguments
        json.dumps(case.arguments)  # what an agent sends is JSON
        assert 1 <= len(case.facts) <= 3
        asked = json.dumps(case.arguments) + "\n" + case.question
        for fact in case.facts:
            assert isinstance(fact, Fact) and fact.reason in REASONS
            assert fact.description and "\n" not in fact.description
            reasons.add(fact.reason)
            # The call names at most its key, never the whole answer.
            assert not all(needle in asked for needle in fact.needles), (case.kind, fact)
    assert reasons == set(REASONS)


def test_every_needle_is_an_atomic_value_in_the_text(cases: list[Case]) -> None:
    for case in cases:
        for fact in case.facts:
            for needle in fact.needles:
                assert needle in case.text, (case.kind, case.format, needle)
                # No formatting: no quotes (JSON would escape them), padding or line breaks.
                assert needle == needle.strip() and needle
                assert '"' not in needle and "\n" not in needle and "  " not in needle, needle
                assert len(needle) <= 120, needle


def test_needles_hold_together_only_at_the_facts_place(cases: list[Case]) -> None:
    for case in cases:
        lines = case.text.split("\n")
        for fact in case.facts:
            holding = {line.strip() for line in lines if all(n in line for n in fact.needles)}
            # One line, or none where the fact spans lines (a traceback, a diff hunk); a tool
            # may print the same line twice (Maven's recap), never two different ones.
            assert len(holding) <= 1, (case.kind, case.format, fact.needles, holding)
            if case.kind in _ONE_RECORD_PER_LINE:
                assert len(holding) == 1, (case.kind, case.format, fact.needles)
            if case.kind == "json":
                assert _records_holding(json.loads(case.text), fact.needles) == 1, fact
            if case.kind == "csv":
                rows = list(csv.reader(io.StringIO(case.text), delimiter=_delimiter(case)))
                matching = [r for r in rows if all(n in "\0".join(r) for n in fact.needles)]
                assert len(matching) == 1, (case.format, fact.needles)
            # Over lines, still in one place (a JSON record is checked above; a tree opens
            # each folder of a path on its own line, far above the file).
            if not holding and case.kind != "json" and case.format != "tree":
                assert _within(lines, fact.needles, span=80), (case.kind, case.format, fact)


def test_outputs_parse_as_their_format(cases: list[Case]) -> None:
    for case in cases:
        if case.kind == "json":
            json.loads(case.text)
        elif case.kind == "jsonl":
            for line in case.text.splitlines():
                assert isinstance(json.loads(line), dict)
        elif case.kind == "csv":
            rows = list(csv.reader(io.StringIO(case.text), delimiter=_delimiter(case)))
            assert len(rows) > 10 and {len(r) for r in rows} == {len(rows[0])}
        elif case.format == "junit_xml":
            root = ET.fromstring(case.text)
            failures = [f for f in root.iter("failure")]
            assert len(failures) == len(case.facts)
        elif case.kind == "html":
            checker = _TagBalance()
            checker.feed(case.text)
            checker.close()
            assert checker.stack == [], checker.stack


def test_sizes_are_log_uniform_over_the_range() -> None:
    counter = TokenCounter()
    sizes = [counter.count(c.text) for seed in EVALUATION_SEEDS[:3] for c in build_cases(seed)]
    assert min(sizes) >= 1_000 and max(sizes) <= 30_000, (min(sizes), max(sizes))
    # Log-uniform over 1,500-20,000: the logs' median near the middle, both ends reached.
    middle = math.log(math.sqrt(1_500 * 20_000))
    assert abs(statistics.median(math.log(s) for s in sizes) - middle) < 0.5
    assert sum(s < 3_000 for s in sizes) >= 5 and sum(s > 10_000 for s in sizes) >= 5


def test_facts_sit_anywhere_in_the_output(cases: list[Case]) -> None:
    thirds = [0, 0, 0]
    by_kind: dict[str, set[int]] = {kind: set() for kind in KINDS}
    for case in cases:
        for fact in case.facts:
            # The fact's place: where its rarest needle first appears.
            rarest = min(fact.needles, key=lambda n: (case.text.count(n), -len(n)))
            third = min(2, 3 * case.text.index(rarest) // len(case.text))
            thirds[third] += 1
            by_kind[case.kind].add(third)
    total = sum(thirds)
    assert all(n >= 0.15 * total for n in thirds), thirds
    # Runners that gather failures at the end (pytest, cargo) are as they are; still, every
    # kind has facts at the start, in the middle and at the end over the seeds.
    assert all(len(seen) == 3 for seen in by_kind.values()), by_kind


def test_building_is_fast() -> None:
    start = time.perf_counter()
    build_cases(EVALUATION_SEEDS[-1])
    assert time.perf_counter() - start < 2.0


# -- helpers ---------------------------------------------------------------------------------
def _delimiter(case: Case) -> str:
    return {"csv": ",", "tsv": "\t", "csv_semicolon": ";"}[case.format]


def _records_holding(node: Any, needles: tuple[str, ...]) -> int:
    """JSON objects holding every needle among their values, none of their members does."""

    def scalars(n: Any) -> str:
        if isinstance(n, dict):
            return "\n".join(scalars(v) for v in n.values())
        if isinstance(n, list):
            return "\n".join(scalars(v) for v in n)
        return str(n)

    def count(n: Any) -> int:
        children = list(n.values()) if isinstance(n, dict) else n if isinstance(n, list) else []
        below = sum(count(child) for child in children)
        if below:
            return below
        text = scalars(n)
        return int(isinstance(n, dict) and all(needle in text for needle in needles))

    return count(node)


def _within(lines: list[str], needles: tuple[str, ...], span: int) -> bool:
    """Whether some window of ``span`` lines holds every needle."""
    where = {n: [i for i, line in enumerate(lines) if n in line] for n in needles}
    anchor = min(needles, key=lambda n: len(where[n]))
    return any(
        all(any(abs(j - i) <= span for j in where[n]) for n in needles) for i in where[anchor]
    )


class _TagBalance(HTMLParser):
    _VOID = frozenset({"meta", "link", "br", "img", "hr", "input", "source"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag not in self._VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()
