"""The swarm benchmark's runs on the hardware twin (``swarm.twin``): the same engine,
runners, policies and governor as the real runs, in virtual time.

What a wrong twin would break: the same prompts sent by every policy (the twin changes
no decision of the program), the same tokens as the real run (``forward=True``), the
same figures to the last bit on a second run, and the engine left as it was found.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from engine.twin import StepNoise, get_profile
from engine.twin.targets import target_model
from kvgov.benchmarks.baselines import Costs
from kvgov.benchmarks.swarm.bench import POLICIES, Setup, run_policy
from kvgov.benchmarks.swarm.twin import TwinDevice, measure_twin_costs, run_twin_policy
from kvgov.benchmarks.swarm.workload import SwarmWorkload

TINY = SwarmWorkload(
    num_teams=1,
    workers_per_team=2,
    turns=2,
    tool_output_tokens=96,
    system_repeats=1,
    tool_scale=0.1,
)
# The engine's own model, timed as Llama 3 8B on the reference card: every token the
# tiny model's, every second the target's.
DEVICE = TwinDevice(get_profile("rx9070xt"), target_model("llama-8b-random").shape)


@pytest.fixture(scope="module")
def setup() -> Setup:
    return Setup.of(TINY)


def _figures(run: object) -> tuple[object, ...]:
    result = run.result  # type: ignore[attr-defined]
    return (
        result.jct_s,
        result.makespan_s,
        result.failed,
        result.prompts,
        result.counters,
        result.peak_blocks,
        result.timeline,
        run.link_bytes,
        run.compute_s,
    )  # type: ignore[attr-defined]


def test_every_policy_runs_on_the_twin_the_same_program_bit_for_bit_twice(setup: Setup) -> None:
    engine = setup.engine(1.0)
    costs = measure_twin_costs(engine, DEVICE)
    assert costs.prefill_s_per_token > 0 and costs.swap_s_per_block > 0  # modelled, not 0
    runs = {}
    for policy in POLICIES:
        first = run_twin_policy(
            engine, DEVICE, policy, 1.0, setup.scripts, setup.prompts, TINY, costs, deadline_s=600.0
        )
        again = run_twin_policy(
            engine, DEVICE, policy, 1.0, setup.scripts, setup.prompts, TINY, costs, deadline_s=600.0
        )
        assert _figures(first) == _figures(again), policy
        assert first.result.failed == []
        runs[policy] = first
        # The twin came off: the engine's own methods and clock again.
        assert {"step", "add_request", "abort"}.isdisjoint(vars(engine))
        assert engine.clock is time.monotonic
    prompts = {p: r.result.prompts for p, r in runs.items()}
    assert all(p == prompts["paged"] for p in prompts.values())  # one program, one workload
    assert len(prompts["paged"]) == sum(len(s.turns) for s in setup.scripts)
    # Virtual time: each job takes at least its tools' latencies, and the steps' model
    # time is what the jobs spent beyond them, seconds of it for an 8B model's prefills.
    for run in runs.values():
        for script in setup.scripts:
            if not script.planner:
                tools = sum(t.tool_s for t in script.turns)
                assert run.result.jct_s[script.name] > tools
        assert run.compute_s > 0.05


def test_the_twin_computes_the_real_runs_tokens_and_prefill(setup: Setup) -> None:
    engine = setup.engine(1.0)
    real = run_policy(
        engine, "paged", 1.0, setup.scripts, setup.prompts, TINY, Costs(1e-4, 1e-5), 120.0
    )
    twin = run_twin_policy(
        engine, DEVICE, "paged", 1.0, setup.scripts, setup.prompts, TINY, None, deadline_s=600.0
    ).result
    assert twin.prompts == real.prompts
    # The prefix cache starts cold and nothing is evicted at 1.0: the engine computes the
    # same prompt tokens whatever the clock says.
    assert twin.counters == real.counters


def test_a_policy_that_prices_its_choices_needs_costs(setup: Setup) -> None:
    engine = setup.engine(1.0)
    with pytest.raises(ValueError, match="give costs"):
        run_twin_policy(
            engine,
            DEVICE,
            "ttl-pin",
            1.0,
            setup.scripts,
            setup.prompts,
            TINY,
            None,
            deadline_s=60.0,
        )
    assert "step" not in vars(engine) and engine.clock is time.monotonic


def test_a_twin_run_past_its_virtual_deadline_stops_and_frees_every_block(setup: Setup) -> None:
    from kvgov.benchmarks.swarm.runner import SwarmTimeout

    engine = setup.engine(1.0)
    for policy in ("paged", "kvgov"):
        with pytest.raises(SwarmTimeout):
            run_twin_policy(
                engine,
                DEVICE,
                policy,
                1.0,
                setup.scripts,
                setup.prompts,
                TINY,
                None,
                deadline_s=0.5,
            )
        assert engine.block_manager.pool.num_in_use == 0
        assert not engine.has_unfinished()


def test_without_the_forward_pass_the_twin_gives_the_same_figures(setup: Setup) -> None:
    # What twin check relies on to run its twin rounds a hundred times faster: with every
    # prompt fixed up front, no decision hangs on the tokens' values. At 0.33, where the
    # policies preempt, hold, offload and recompute, with the steps and tools scattered.
    engine = setup.engine(0.33)
    bookkeeping = dataclasses.replace(DEVICE, forward=False)
    costs = measure_twin_costs(engine, DEVICE)
    assert measure_twin_costs(engine, bookkeeping) == costs
    for policy in POLICIES:
        first, second = (
            run_twin_policy(
                engine,
                device,
                policy,
                0.33,
                setup.scripts,
                setup.prompts,
                TINY,
                costs,
                deadline_s=600.0,
                noise=StepNoise(0.1, seed=3),
                tool_lateness_s=(0.004, 0.009),
            )
            for device in (DEVICE, bookkeeping)
        )
        assert _figures(first) == _figures(second), policy


def test_the_twins_scatter_is_drawn_from_its_seed(setup: Setup) -> None:
    engine = setup.engine(0.33)
    device = dataclasses.replace(DEVICE, forward=False)

    def run(noise: StepNoise | None, late: tuple[float, ...] = ()) -> object:
        return run_twin_policy(
            engine,
            device,
            "kvgov",
            0.33,
            setup.scripts,
            setup.prompts,
            TINY,
            None,
            deadline_s=600.0,
            noise=noise,
            tool_lateness_s=late,
        )

    a, b, c = (run(StepNoise(0.1, seed=s), (0.004, -0.001)) for s in (1, 1, 2))
    plain = run(None)
    assert _figures(a) == _figures(b)
    assert a.compute_s != c.compute_s != plain.compute_s  # type: ignore[attr-defined]
    tools = sum(1 for s in setup.scripts if not s.planner for t in s.turns if t.tool)
    # Each tool wait returned late by one of the samples (none below zero); the plain
    # twin's loop is punctual.
    for late in (a.result.tool_lateness_s, plain.result.tool_lateness_s):  # type: ignore[attr-defined]
        assert len(late) == tools
    assert {round(x, 9) for x in a.result.tool_lateness_s} == {0.004, 0.0}  # type: ignore[attr-defined]
    assert max(plain.result.tool_lateness_s) == pytest.approx(0.0, abs=1e-9)  # type: ignore[attr-defined]


def test_a_real_kvgov_run_records_how_late_its_tools_returned(setup: Setup) -> None:
    engine = setup.engine(1.0)
    real = run_policy(
        engine, "kvgov", 1.0, setup.scripts, setup.prompts, TINY, Costs(1e-4, 1e-5), 120.0
    )
    tools = sum(1 for s in setup.scripts if not s.planner for t in s.turns if t.tool)
    assert len(real.tool_lateness_s) == tools
    # A real loop returns a sleeper at its time or after it, never a tool's length late.
    assert all(-0.002 < late < 0.5 for late in real.tool_lateness_s), real.tool_lateness_s
