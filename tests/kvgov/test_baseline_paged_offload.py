"""``paged+offload`` (vLLM with CPU KV offloading) on the real engine (tiny-random): an
idle agent's context is written to host memory and its next call loads it instead of
computing it again (the engine's prefill counters), the least recently offloaded
contexts make room when the host is full, and nothing is leaked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine import Engine, EngineConfig, PreemptionMode, SamplingParams
from kvgov.benchmarks.baselines import PagedOffload, make_baseline
from kvgov.benchmarks.swarm.runner import Agent, AgentState
from kvgov.benchmarks.swarm.workload import AgentScript, Turn

SAMPLING = SamplingParams(max_tokens=4, temperature=0.0)
BLOCK = 16


def prompt(seed: int) -> list[int]:
    """200 tokens (12 full blocks and a tail), different for each seed."""
    return [(i * 7919 + seed * 104_729) % 50_000 + 1 for i in range(200)]


@pytest.fixture(scope="module")
def built() -> Engine:
    """A host of 30 blocks: two 12-block contexts fit there, a third does not."""
    config = EngineConfig(
        num_blocks=64, swap_space_blocks=30, preemption_mode=PreemptionMode.RECOMPUTE
    )
    return Engine(config)


@pytest.fixture
def engine(built: Engine) -> Iterator[Engine]:
    built.reset_prefix_cache()
    yield built
    for budget in [b.name for b in built.block_manager.budgets]:
        built.close_budget(budget)
    assert built.metrics().num_blocks_in_use == 0  # nothing leaked
    host = built.block_manager.host_pool
    assert host.num_free_blocks == host.num_blocks


def idle_agent(engine: Engine, policy: PagedOffload, name: str, seed: int) -> list[int]:
    """An agent's call runs and ends in a tool call, handed to the policy as
    ``SwarmRunner`` does; the context it leaves."""
    turn = Turn(({"role": "user", "content": "x"},), "run_command", 1.0, 1.0)
    agent = Agent(AgentScript(name, 0, False, (turn, turn), 0.0), 0, f"agent-{name}")
    engine.open_budget(agent.budget, 64)
    done = engine.generate(prompt(seed), SAMPLING, budget=agent.budget)[0]
    context = [*done.prompt_token_ids, *done.token_ids]
    agent.context_tokens, agent.state = len(context), AgentState.IDLE
    policy.on_idle(engine, agent, now=0.0)
    return context


def next_call(engine: Engine, policy: PagedOffload, name: str, context: list[int]) -> int:
    """The agent's next call, restored as the runner would; the tokens it recomputed."""
    turn = Turn(({"role": "user", "content": "x"},), "run_command", 1.0, 1.0)
    agent = Agent(AgentScript(name, 0, False, (turn, turn), 0.0), 0, f"agent-{name}", turn=1)
    policy.before_call(engine, agent)
    assert not engine.retained.is_offloaded(agent.budget)  # back before the call is sent
    before = engine.metrics().num_recomputed_tokens
    engine.generate([*context, 7], SAMPLING, budget=agent.budget, priority=policy.priority(agent))
    return engine.metrics().num_recomputed_tokens - before


def test_make_baseline_builds_it_without_costs() -> None:
    policy = make_baseline("paged+offload", None)
    assert isinstance(policy, PagedOffload)
    assert policy.name == "paged+offload"
    with pytest.raises(ValueError, match="paged\\+offload"):
        make_baseline("paged-offload", None)


def test_a_context_comes_back_from_host_instead_of_being_computed_again(
    engine: Engine,
) -> None:
    policy = PagedOffload()
    context = idle_agent(engine, policy, "a", seed=1)
    assert engine.retained.is_offloaded("agent-a")
    assert engine.metrics().num_blocks_in_use == 0  # the device holds none of it
    engine.reset_prefix_cache()  # its device copies are gone: only the host has it
    swapped_in = engine.metrics().num_blocks_swapped_in
    recomputed = next_call(engine, policy, "a", context)
    assert engine.metrics().num_blocks_swapped_in - swapped_in == 12
    # Only the tail past its 12 full blocks is computed again.
    assert recomputed == len(context) - 1 - 12 * BLOCK
    assert policy.num_offloaded == 1


def test_the_least_recently_offloaded_context_makes_room_when_the_host_is_full(
    engine: Engine,
) -> None:
    policy = PagedOffload()
    contexts = [idle_agent(engine, policy, name, seed) for seed, name in enumerate("abc")]
    # 30 host blocks: a's 12 went for c's, b's stayed.
    offloaded = {n: engine.retained.is_offloaded(f"agent-{n}") for n in "abc"}
    assert offloaded == {"a": False, "b": True, "c": True}
    assert engine.retained.held_budgets() == {"agent-b", "agent-c"}
    assert policy.num_evicted == 1
    engine.reset_prefix_cache()
    assert next_call(engine, policy, "a", contexts[0]) == len(contexts[0]) - 1  # all again
    assert next_call(engine, policy, "b", contexts[1]) == len(contexts[1]) - 1 - 12 * BLOCK


def test_a_context_larger_than_the_free_host_stays_in_the_prefix_cache(engine: Engine) -> None:
    policy = PagedOffload()
    engine.open_budget("swapped", 64)
    # Another request holds 29 of the 30 host blocks (offloaded while it runs), so an
    # idle context of 12 blocks finds no room, and there is no offloaded context to drop.
    request = engine.add_request(prompt(9)[:150] * 3, SAMPLING, budget="swapped")
    try:
        engine.step()
        engine.offload(request)
        assert engine.block_manager.host_pool.num_free_blocks < 12
        idle_agent(engine, policy, "a", seed=1)
        assert engine.retained.held_budgets() == frozenset()
        assert policy.num_offloaded == 0
    finally:
        engine.abort(request)
        engine.pop_completion(request)
