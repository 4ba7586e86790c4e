"""Context editing's knobs in the whole-system comparison (``openloop/editing_knobs.py``):
its trigger and how many tool results it keeps, tuned together on the tuning seed by the
least geometric mean job time of the baselines with context editing, as kvgov's context
is tuned on its two. The real LangChain middleware and the real engine (the stand-in the
twin times) on the tiny workload of ``test_openloop_system``."""

from __future__ import annotations

import dataclasses
import math

import pytest

from kvgov.benchmarks.openloop import bench, system
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.context_tuning import tune_editing as tune
from kvgov.benchmarks.openloop.editing_knobs import EditingKnobs, choose
from kvgov.benchmarks.openloop.handled import counter
from kvgov.benchmarks.openloop.langchain_context import CONTEXT_EDITING, handle
from kvgov.benchmarks.openloop.system import System
from tests.kvgov.test_openloop_system import RATE, TINY, WINDOW_TOKENS, WINDOWS_S

_CLEARED = "Tool result:\n[cleared]"
POLICIES = ("paged",)


def _results(messages: object) -> list[str]:
    return [m["content"] for m in messages if m["content"].startswith("Tool result:")]  # type: ignore[attr-defined]


def test_keep_is_how_many_of_the_latest_tool_results_stay_whole() -> None:
    raw = dataclasses.replace(TINY, facts=True, tool_output_tokens=None, ceiling_tokens=None)
    scripts, _ = openloop.build_planted(raw, counter())
    cleared = {}
    for keep in (1, 3):
        knobs = EditingKnobs(trigger_tokens=1_200, keep=keep)
        handled = handle(scripts, knobs.handling(WINDOW_TOKENS), counter())
        cleared[keep] = 0
        for script in handled.scripts:
            for turn in script.turns:
                results = _results(turn.messages)
                if _CLEARED in results:  # edited: all but the latest `keep` cleared
                    whole = [r for r in results if r != _CLEARED]
                    assert len(whole) <= keep, (keep, script.name)
                    assert _CLEARED not in results[len(results) - len(whole) :]
                cleared[keep] += results.count(_CLEARED)
    assert cleared[1] > cleared[3] > 0, cleared


def test_points_are_ordered_by_how_late_they_clear_then_by_what_they_keep() -> None:
    assert EditingKnobs(8_000, 6) < EditingKnobs(16_000, 1)
    assert EditingKnobs(8_000, 1) < EditingKnobs(8_000, 3)
    near = {EditingKnobs(8_000, 1): 100.0, EditingKnobs(8_000, 3): 100.9}
    assert choose(near) == EditingKnobs(8_000, 3)  # within 1%: keeps more
    apart = {EditingKnobs(8_000, 1): 100.0, EditingKnobs(8_000, 3): 102.0}
    assert choose(apart) == EditingKnobs(8_000, 1)
    assert EditingKnobs(8_000).keep == 3  # ClearToolUsesEdit's default
    label = EditingKnobs(8_000, 6).handling(32_768).label
    assert "trigger 8,000, keep 6" in label


def test_a_bad_keep_says_what_to_set() -> None:
    with pytest.raises(ValueError, match="keep is the tool results kept whole"):
        EditingKnobs(8_000, -1).handling(32_768)


def test_tuning_runs_the_baselines_with_context_editing_on_the_tuning_seed() -> None:
    triggers, keeps = (1_200,), (1, 3)
    chosen, table = tune(
        (RATE,),
        window_s={RATE: WINDOWS_S[RATE]},
        policies=POLICIES,
        triggers=triggers,
        keeps=keeps,
        base=TINY,
        window_tokens=WINDOW_TOKENS,
    )
    assert set(table) == {EditingKnobs(t, k) for t in triggers for k in keeps}
    objective = {
        p: math.exp(sum(map(math.log, row.values())) / len(row)) for p, row in table.items()
    }
    assert chosen == choose(objective)
    # Each point's row is the baselines with context editing on the tuning seed, keep and
    # all: the two keeps send other prompts, so they run other jobs' times.
    for point, row in table.items():
        runs = system.run_seed(
            bench.TUNING_SEED,
            (RATE,),
            window_s=WINDOWS_S,
            policies=POLICIES,
            editing=point,
            only=[System(p, CONTEXT_EDITING) for p in POLICIES],
            base=TINY,
            window_tokens=WINDOW_TOKENS,
        )
        assert runs.editing == point
        assert row == {
            f"{p}@{RATE:g}": runs.results[(f"{p}+{CONTEXT_EDITING}", RATE)].jct_mean_s
            for p in POLICIES
        }
    assert table[EditingKnobs(1_200, 1)] != table[EditingKnobs(1_200, 3)]
