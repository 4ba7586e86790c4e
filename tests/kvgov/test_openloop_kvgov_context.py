"""kvgov's context knobs in the whole-system comparison (``openloop/kvgov_context.py``):
they bound kvgov's prompts and no other system's, and are chosen on the tuning seed by
the rule that chose context editing's knobs, among the points that keep as many facts
as the best LangChain handling. The real engine (the stand-in the twin times) on the
tiny workload of ``test_openloop_system``."""

from __future__ import annotations

import dataclasses
import math

import pytest

from kvgov.benchmarks.context import SUMMARY_SHARE
from kvgov.benchmarks.openloop import bench, system
from kvgov.benchmarks.openloop.context_tuning import tune_kvgov_context as tune
from kvgov.benchmarks.openloop.editing_knobs import choose
from kvgov.benchmarks.openloop.handled import KVGOV, prepare
from kvgov.benchmarks.openloop.kvgov_context import KvgovContext, choose_keeping
from kvgov.benchmarks.openloop.langchain_context import HANDLINGS
from kvgov.benchmarks.openloop.system import SeedRuns, System
from kvgov.benchmarks.openloop.workload_setup import longest_call
from tests.kvgov.test_openloop_system import EDITING, RATE, TINY, WINDOW_TOKENS, WINDOWS_S

TIGHT = KvgovContext(ceiling_tokens=1_000, tool_output_tokens=100)
POLICIES = ("paged",)


def _run(seed: int, context: KvgovContext | None, **kwargs: object) -> SeedRuns:
    return system.run_seed(
        seed,
        (RATE,),
        window_s=WINDOWS_S,
        policies=POLICIES,
        editing=EDITING,
        base=TINY,
        window_tokens=WINDOW_TOKENS,
        kvgov_context=context,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def both() -> tuple[SeedRuns, SeedRuns]:
    """One seed with the workload's own context for kvgov (1,500 and 200), and with
    ``TIGHT``."""
    return _run(1, None), _run(1, TIGHT)


def test_kvgov_s_context_bounds_its_prompts_and_no_other_system_s(both) -> None:
    own, tight = both
    assert own.kvgov_context == KvgovContext(TINY.ceiling_tokens, TINY.tool_output_tokens)
    assert tight.kvgov_context == TIGHT
    for s in system.systems(POLICIES):
        before, after = own.results[(s.name, RATE)], tight.results[(s.name, RATE)]
        assert not before.failed and not after.failed, s.name
        if s.policy == KVGOV:
            assert before.prompts != after.prompts
        else:  # the LangChain handlings send raw outputs, whatever kvgov's context
            assert before.prompts == after.prompts, s.name
    # kvgov's calls fit its tighter ceiling with their replies; under its own they did not.
    longest = {}
    for name, context in (("own", None), ("tight", TIGHT)):
        workload = dataclasses.replace(TINY, facts=True)
        workload = workload if context is None else context.apply(workload)
        setup = prepare(
            workload, window_tokens=WINDOW_TOKENS, editing=EDITING, block_size=16
        ).setups[KVGOV]
        longest[name] = max(longest_call(s, setup.prompts) for s in setup.scripts)
    assert longest["tight"] <= TIGHT.ceiling_tokens < longest["own"], longest


def test_points_are_ordered_by_what_they_keep_and_ties_go_to_the_larger() -> None:
    assert KvgovContext(8_000, 2_048) < KvgovContext(16_000, 1_024)
    assert KvgovContext(8_000, 1_024) < KvgovContext(8_000, 2_048)
    near = {KvgovContext(8_000, 1_024): 100.0, KvgovContext(8_000, 2_048): 100.9}
    assert choose(near) == KvgovContext(8_000, 2_048)  # within 1%: keeps more
    apart = {KvgovContext(8_000, 1_024): 100.0, KvgovContext(8_000, 2_048): 102.0}
    assert choose(apart) == KvgovContext(8_000, 1_024)


def test_tuning_runs_kvgov_alone_on_the_tuning_seed_and_chooses_by_the_rule(both) -> None:
    ceilings, outputs = (TIGHT.ceiling_tokens,), (TIGHT.tool_output_tokens,)
    shares = (SUMMARY_SHARE, 0.5)
    chosen, table = tune(
        (RATE,),
        window_s={RATE: WINDOWS_S[RATE]},
        ceilings=ceilings,
        tool_outputs=outputs,
        summary_shares=shares,
        compact_tos=(1.0,),
        base=TINY,
        window_tokens=WINDOW_TOKENS,
        editing=EDITING,
    )
    assert set(table) == {KvgovContext(c, t, s) for c in ceilings for t in outputs for s in shares}
    objective = {
        p: math.exp(sum(map(math.log, r.jct_mean_s.values())) / len(r.jct_mean_s))
        for p, r in table.items()
    }
    facts = {p: r.facts_kept_pct for p, r in table.items()}
    (floor,) = {r.facts_floor_pct for r in table.values()}  # the LangChain handlings' own
    assert chosen == choose_keeping(objective, facts, floor)
    # Each point's figure is kvgov's run on the tuning seed; seed 1's differs.
    only = [System(KVGOV, KVGOV)]
    runs = _run(bench.TUNING_SEED, TIGHT, only=only)
    tuning = runs.results[(KVGOV, RATE)]
    assert table[TIGHT].jct_mean_s == {RATE: tuning.jct_mean_s}
    assert table[TIGHT].facts_kept_pct == runs.facts[(KVGOV, RATE)].pct
    assert floor == max(runs.facts[(h, RATE)].pct for h in HANDLINGS)
    _, tight = both
    assert tight.results[(KVGOV, RATE)].jct_mean_s != tuning.jct_mean_s


def test_the_fastest_point_that_keeps_as_many_facts_as_langchain_is_chosen() -> None:
    fast, slow, slower = (
        KvgovContext(8_000, 2_048),
        KvgovContext(16_000, 2_048),
        KvgovContext(24_000, 2_048),
    )
    objective = {fast: 300.0, slow: 500.0, slower: 700.0}
    facts = {fast: 50.0, slow: 75.0, slower: 83.0}
    assert choose_keeping(objective, facts, 74.0) == slow
    assert choose_keeping(objective, facts, 40.0) == fast
    # None keeps as many: the one that keeps most.
    assert choose_keeping(objective, facts, 90.0) == slower


def test_a_summary_share_other_than_a_quarter_names_its_system() -> None:
    assert KvgovContext(8_000, 2_048).system == "kvgov@8000"
    half = KvgovContext(8_000, 2_048, 0.5)
    assert half.system == "kvgov@8000/0.5"
    assert half.apply(TINY).summary_share == 0.5
    assert "a summary of up to 0.5 of it" in half.describe()
    under = KvgovContext(8_000, 2_048, 0.5, 0.8)
    assert under.system == "kvgov@8000/0.5/to0.8"
    assert under.apply(TINY).compact_to == 0.8
    assert "down to 0.8 of it" in under.describe() and "down to" not in half.describe()
    assert under < half  # compacting to the ceiling keeps more


def test_a_context_the_workload_refuses_says_what_to_raise() -> None:
    with pytest.raises(ValueError, match="ceiling_tokens must be an int of at least"):
        KvgovContext(ceiling_tokens=100, tool_output_tokens=100).apply(
            dataclasses.replace(TINY, facts=True)
        )
