"""Each baseline policy of ``kvgov bench swarm`` does what its paper's rule says, on the
real engine (tiny-random): paged lets an idle agent's KV go, ttl-pin pins it for the TTL
its rule picks and lets it go after, intercept keeps, swaps or discards it by its waste
formulas."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, PreemptionMode, SamplingParams
from kvgov.benchmarks.baselines import Costs, Intercept, Paged, TtlPin
from kvgov.benchmarks.swarm.runner import Agent, AgentState
from kvgov.benchmarks.swarm.workload import AgentScript, Turn

PROMPT = [(i * 7919) % 50_000 + 1 for i in range(200)]  # 12 full blocks and a tail
SAMPLING = SamplingParams(max_tokens=4, temperature=0.0)
COSTS = Costs(prefill_s_per_token=1e-3, swap_s_per_block=1e-4)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(EngineConfig(num_blocks=64, preemption_mode=PreemptionMode.RECOMPUTE))


def idle_agent(engine: Engine, *, tool_s: float, expected_s: float) -> Agent:
    """An agent whose call just ended in a tool call (its request popped), as the runner
    hands it to a policy."""
    turn = Turn(({"role": "user", "content": "x"},), "run_command", tool_s, expected_s)
    script = AgentScript("t0-w0", 0, False, (turn, turn), 0.0)
    agent = Agent(script, 1, "agent-t0-w0", AgentState.IDLE)
    engine.reset_prefix_cache()
    engine.open_budget(agent.budget, 64)
    done = engine.generate(PROMPT, SAMPLING, budget=agent.budget)[0]
    agent.context_tokens = len(done.prompt_token_ids) + len(done.token_ids)
    return agent


def test_paged_holds_nothing_for_an_idle_agent(engine: Engine) -> None:
    agent = idle_agent(engine, tool_s=0.1, expected_s=0.1)
    try:
        Paged().on_idle(engine, agent, now=0.0)
        assert engine.retained.held_budgets() == frozenset()
        assert engine.metrics().num_blocks_in_use == 0  # its blocks are only cached
    finally:
        engine.close_budget(agent.budget)


def test_ttl_pin_pins_for_its_ttl_and_then_moves_it_to_host(engine: Engine) -> None:
    agent = idle_agent(engine, tool_s=0.2, expected_s=0.2)
    # A swap dearer than the recompute: the reload the pin saves is the recompute's.
    policy = TtlPin(Costs(prefill_s_per_token=1e-3, swap_s_per_block=0.1))
    try:
        # Continuum's TTL over the prior (the runtime's 0.2 s expected, exponential):
        # the tau where the chance the tool is back, times the reload, stops paying for
        # the time held (the rules themselves: tests/kvgov/test_baseline_continuum.py).
        ttl = policy.ttl(engine, agent)
        assert 0.2 < ttl < 0.5
        policy.on_idle(engine, agent, now=10.0)
        assert engine.retained.held_budgets() == {agent.budget}
        assert engine.metrics().num_blocks_in_use == 12  # its full blocks, on the device
        policy.tick(engine, now=10.0 + ttl / 2)
        assert engine.metrics().num_blocks_in_use == 12  # within the TTL
        policy.tick(engine, now=10.0 + ttl + 0.01)
        # Expired with room on the host: moved there, still held, the device's blocks free.
        assert engine.retained.held_budgets() == {agent.budget}
        assert engine.retained.is_offloaded(agent.budget)
        assert engine.metrics().num_blocks_in_use == 0
    finally:
        engine.close_budget(agent.budget)


def test_ttl_pin_does_not_pin_through_a_tool_longer_than_its_reload(
    engine: Engine,
) -> None:
    agent = idle_agent(engine, tool_s=60.0, expected_s=60.0)
    try:
        # 60 s x 13/64 of the pool costs more than the 0.204 s reload saves.
        assert TtlPin(COSTS).ttl(engine, agent) == 0.0
    finally:
        engine.close_budget(agent.budget)


@pytest.mark.parametrize(
    ("expected_s", "swap_s_per_block", "choice"),
    [
        (0.001, 1e-4, "keep"),  # 0.013 block-s held < 2.6 to recompute, 0.03 to swap
        (30.0, 1e-4, "swap"),  # 390 block-s held > 2.6 to recompute > 0.03 to swap
        (30.0, 1.0, "discard"),  # a slow link: 338 block-s to swap > 2.6 to recompute
    ],
)
def test_intercept_picks_the_least_waste(
    engine: Engine, expected_s: float, swap_s_per_block: float, choice: str
) -> None:
    agent = idle_agent(engine, tool_s=expected_s, expected_s=expected_s)
    policy = Intercept(Costs(prefill_s_per_token=1e-3, swap_s_per_block=swap_s_per_block))
    try:
        policy.on_idle(engine, agent, now=0.0)
        assert policy.decisions == {choice: 1}
        held = engine.retained.held_budgets()
        assert held == (frozenset() if choice == "discard" else {agent.budget})
        assert engine.retained.is_offloaded(agent.budget) == (choice == "swap")
        policy.before_call(engine, agent)
        assert not engine.retained.is_offloaded(agent.budget)  # back before its next call
    finally:
        engine.close_budget(agent.budget)
