"""``kvgov bench reduce``: facts are scored by their needles in the reduced text, every
reduction is held to its budget, the tuning seed never runs, and the figures add up.

The scoring is proved on two test-only policies: one that returns the lines holding the
needles (every fact kept) and one that returns nothing (none kept).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pytest

from governor import TokenCounter, ToolOutputReduction
from kvgov.benchmarks import reduce
from kvgov.cli import BENCHMARKS
from policies.benchmarks.tool_outputs import KINDS, TUNING_SEED, Case, build_cases


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


@pytest.fixture(scope="module")
def cases() -> list[tuple[int, Case]]:
    return [(1, case) for case in build_cases(1, per_kind=1)]


class _Oracle:
    """Knows each case's facts: returns, per needle, the shortest line holding it (or the
    needle alone where that line is too long), so a perfect reduction keeps every fact."""

    def __init__(self, cases: list[tuple[int, Case]]) -> None:
        self._needles = {case.text: [n for f in case.facts for n in f.needles] for _, case in cases}

    def reduce(self, text: str, *, budget_tokens: int, **_: Any) -> ToolOutputReduction:
        kept = []
        for needle in self._needles[text]:
            line = min((x for x in text.split("\n") if needle in x), key=len)
            kept.append(line if len(line) <= 200 else needle)
        out = "\n".join(dict.fromkeys(kept))
        return ToolOutputReduction(out, 0, 0, "oracle", 0.0)


class _Empty:
    def reduce(self, text: str, *, budget_tokens: int, **_: Any) -> ToolOutputReduction:
        return ToolOutputReduction("", 0, 0, "empty", 0.0)


class _Unchanged:
    def reduce(self, text: str, *, budget_tokens: int, **_: Any) -> ToolOutputReduction:
        return ToolOutputReduction(text, 0, 0, "none", 0.0)


class _WithQuestion:
    def __init__(self) -> None:
        self.seen: list[str | None] = []

    def reduce(
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        question: str | None = None,
    ) -> ToolOutputReduction:
        self.seen.append(question)
        return ToolOutputReduction("", 0, 0, "empty", 0.0)


class _WithoutQuestion:
    def reduce(
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> ToolOutputReduction:
        return ToolOutputReduction("", 0, 0, "empty", 0.0)


def test_registered_with_the_cli() -> None:
    assert BENCHMARKS["reduce"] == "kvgov.benchmarks.reduce"


def test_a_perfect_reduction_keeps_every_fact_and_an_empty_one_none(
    cases: list[tuple[int, Case]], counter: TokenCounter
) -> None:
    policies = {"oracle": _Oracle(cases), "empty": _Empty()}
    outcomes = reduce.evaluate(cases, policies, counter, reduce.BUDGETS)
    assert len(outcomes) == len(cases) * len(reduce.BUDGETS) * 2
    for o in outcomes:
        assert o.facts == len(next(c for _, c in cases if c.kind == o.kind).facts)
        assert o.facts_kept == (o.facts if o.method == "oracle" else 0), o
    assert {o.kind for o in outcomes} == set(KINDS)


def test_a_fact_needs_every_needle(cases: list[tuple[int, Case]]) -> None:
    for _, case in cases:
        for i, fact in enumerate(case.facts):
            assert reduce.score(case, " ".join(fact.needles))[i]
            if len(fact.needles) > 1:
                assert not reduce.score(case, " ".join(fact.needles[1:]))[i]


def test_a_reduction_over_its_budget_raises(
    cases: list[tuple[int, Case]], counter: TokenCounter
) -> None:
    with pytest.raises(reduce.OverBudgetError) as caught:
        reduce.evaluate(cases[:1], {"unchanged": _Unchanged()}, counter, (200,))
    error = caught.value
    assert error.method == "unchanged" and error.budget == 200
    assert error.tokens == counter.count(cases[0][1].text) > 200


def test_the_question_goes_only_to_policies_that_take_it(
    cases: list[tuple[int, Case]], counter: TokenCounter
) -> None:
    asks = _WithQuestion()
    reduce.evaluate(cases[:2], {"asks": asks, "plain": _WithoutQuestion()}, counter, (400,))
    assert asks.seen == [case.question for _, case in cases[:2]]


def test_quick_run_figures_agree_with_their_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    seeds: list[int] = []

    def recording(seed: int, **kwargs: Any) -> list[Case]:
        seeds.append(seed)
        return build_cases(seed, **kwargs)

    monkeypatch.setattr(reduce, "build_cases", recording)
    figures = {m["metric"]: m for m in reduce.run(quick=True)}
    json.dumps(list(figures.values()))  # one JSON object per line in the CLI
    # The tuning seed's outputs warm the timing's counter, last, untimed and unreported.
    assert seeds[:-1] == list(reduce._QUICK_SEEDS) and seeds[-1] == TUNING_SEED
    policies, _ = reduce.methods(TokenCounter())
    kept: dict[tuple[str, int], int] = {}
    for method in policies:
        for budget in reduce.BUDGETS:
            figure = figures[f"facts_kept_pct_{method}_{budget}"]
            assert figure["bench"] == "reduce" and figure["unit"] == "%"
            n, total = (int(x) for x in re.match(r"(\d+) of (\d+) facts", figure["note"]).groups())
            assert figure["value"] == pytest.approx(100 * n / total)
            most = int(figure["note"].split("max ")[1].split(" ")[0].replace(",", ""))
            assert most <= budget
            assert (
                "no model reads" in figure["note"]
                and f"tuning seed {TUNING_SEED}" in figure["note"]
            )
            kept[method, budget] = n
            per_1k = figures[f"facts_per_1k_tokens_{method}_{budget}"]
            assert per_1k["note"].startswith(f"{n} facts kept in ")
        by_kind = [figures[f"facts_kept_pct_{method}_{kind}_400"]["note"] for kind in KINDS]
        assert sum(int(note.split(" of ")[0]) for note in by_kind) == kept[method, 400]
    ratio = figures["facts_kept_extractive_over_head_tail"]["value"]
    assert ratio == pytest.approx(kept["extractive", 400] / kept["head_tail", 400])
    timing = figures["reduce_ms_per_10k_tokens"]
    assert timing["value"] > 0 and timing["direction"] == "lower" and timing["target"] == 20
    worst = figures["facts_kept_pct_extractive_worst_kind_400"]
    shares = {kind: figures[f"facts_kept_pct_extractive_{kind}_400"]["value"] for kind in KINDS}
    assert worst["value"] == min(shares.values()) and worst["target"] == 60
    assert worst["note"].startswith(min(shares, key=lambda kind: shares[kind]))
    assert figures["facts_kept_pct_extractive_400"]["target"] == 80
