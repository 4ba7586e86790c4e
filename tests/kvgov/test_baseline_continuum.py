"""Continuum (``ttl-pin``) does what its paper says, on the real engine (tiny-random): its
TTL counts the queueing delay an eviction causes, its tool durations are a prior that
each record moves, its calls keep their program's arrival and a pinned call goes first,
and an expired pin goes to host memory when the host has room (and comes back before
the next call) and to the prefix cache when it has none. The test drives the policy's
hooks as ``SwarmRunner`` does, with run times it chooses, so no figure hangs on the
machine's speed."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from engine import Engine, EngineConfig, PreemptionMode, SamplingParams
from engine.request import Request
from kvgov.benchmarks.baselines import Costs, TtlPin
from kvgov.benchmarks.baselines.continuum import ToolDurations
from kvgov.benchmarks.swarm.runner import Agent, AgentState
from kvgov.benchmarks.swarm.workload import AgentScript, Turn

PROMPT = [(i * 7919) % 50_000 + 1 for i in range(200)]  # 12 full blocks and a tail
SAMPLING = SamplingParams(max_tokens=4, temperature=0.0)
CHEAP = Costs(prefill_s_per_token=1e-4, swap_s_per_block=1e-4)  # reloads worth no pin


@pytest.fixture(scope="module")
def roomy() -> Engine:
    return Engine(EngineConfig(num_blocks=64, preemption_mode=PreemptionMode.RECOMPUTE))


@pytest.fixture(scope="module")
def cramped() -> Engine:
    """A host with 4 blocks: no context of this test fits there."""
    return Engine(
        EngineConfig(num_blocks=64, swap_space_blocks=4, preemption_mode=PreemptionMode.RECOMPUTE)
    )


@pytest.fixture
def engine(roomy: Engine) -> Iterator[Engine]:
    yield from _clean(roomy)


def _clean(engine: Engine) -> Iterator[Engine]:
    engine.reset_prefix_cache()
    yield engine
    for budget in [b.name for b in engine.block_manager.budgets]:
        engine.close_budget(budget)
    # nothing leaked: no block in use, every host block free
    assert engine.metrics().num_blocks_in_use == 0
    host = engine.block_manager.host_pool
    assert host.num_free_blocks == host.num_blocks


def make_agent(engine: Engine, name: str, *, expected_s: float, started_at: float = 0.0) -> Agent:
    turn = Turn(({"role": "user", "content": "x"},), "run_command", expected_s, expected_s)
    script = AgentScript(name, 0, False, (turn, turn, turn), 0.0)
    agent = Agent(script, 0, f"agent-{name}", started_at=started_at)
    engine.open_budget(agent.budget, 64)
    return agent


def submit(engine: Engine, policy: TtlPin, agent: Agent, prompt: list[int], now: float) -> None:
    """What ``SwarmRunner._submit`` does at run time ``now``."""
    policy.before_call(engine, agent)
    at = policy.order_time(agent)
    agent.request_id = engine.add_request(
        prompt,
        SAMPLING,
        budget=agent.budget,
        priority=policy.priority(agent),
        order_time=None if at is None else engine.clock() - (now - at),
    )
    agent.state = AgentState.CALLING


def finish(engine: Engine, policy: TtlPin, agent: Agent, now: float) -> list[int]:
    """Step until the agent's call ends, then hand it to the policy as ending in a tool
    call at run time ``now``; the context it leaves."""
    for _ in range(1_000):
        s = engine.scheduler
        if agent.request_id not in {r.request_id for r in (*s.waiting, *s.running, *s.swapped)}:
            break
        engine.step()
    done = engine.pop_completion(agent.request_id or "")
    context = [*done.prompt_token_ids, *done.token_ids]
    agent.context_tokens = len(context)
    agent.state = AgentState.IDLE
    policy.on_idle(engine, agent, now)
    return context


def test_the_ttl_grows_with_the_queueing_delay_evicted_calls_saw(engine: Engine) -> None:
    policy = TtlPin(CHEAP)
    agent = make_agent(engine, "a", expected_s=1.0)
    submit(engine, policy, agent, PROMPT, now=0.0)
    context = finish(engine, policy, agent, now=1.0)
    # A reload of 1.3 ms is not worth a second of the pool: no pin, to host at once.
    assert policy.queue_delay_s == 0.0
    assert engine.retained.is_offloaded(agent.budget)
    before = policy.ttl(engine, agent)
    assert before == 0.0
    # Its tool returns at 2.0; the call, its context let go, waits in the queue until the
    # step after 5.0 admits it: 3 s of queueing an eviction caused.
    agent.ready_at = 2.0
    submit(engine, policy, agent, [*context, 7, 8, 9], now=2.0)
    policy.tick(engine, now=5.0)
    assert policy.queue_delay_s == 0.0  # not admitted yet: no sample
    engine.step()
    policy.tick(engine, now=5.0)
    assert policy.queue_delay_s == pytest.approx(3.0)
    # Benefit 3 s x eta 1: pinning pays for about a second of a 1 s-mean tool.
    finish(engine, policy, agent, now=6.0)
    after = policy.ttl(engine, agent)
    assert after > 0.5
    assert engine.retained.held_budgets() == {agent.budget}
    assert not engine.retained.is_offloaded(agent.budget)  # pinned on the device


def test_the_tool_durations_are_a_prior_each_record_moves() -> None:
    durations = ToolDurations()
    prior = 1 - math.exp(-1.0)  # the exponential of mean 1 s, at 1 s
    assert durations.cdf("pytest", 1.0, mean_s=1.0) == pytest.approx(prior)
    durations.record("pytest", 5.0)
    # One record does not decide (the old rule's P(1 s) was 0 after one 5 s record) ...
    assert durations.cdf("pytest", 1.0, mean_s=1.0) == pytest.approx(prior, abs=0.02)
    for _ in range(300):
        durations.record("pytest", 5.0)
    # ... many do: its own records, weighted against K = 100, and less so another tool's.
    own = durations.cdf("pytest", 1.0, mean_s=1.0)
    other = durations.cdf("grep", 1.0, mean_s=1.0)
    assert own < 0.1 < other < prior
    assert durations.num_records("pytest") == 301


def test_the_policy_records_each_tools_duration_and_its_ttl_follows(engine: Engine) -> None:
    # Reload 0.13 s from host: pinning a tool of mean 1 s is not worth it a priori...
    policy = TtlPin(Costs(prefill_s_per_token=1e-3, swap_s_per_block=1e-2), num_prior_samples=2)
    agent = make_agent(engine, "a", expected_s=1.0)
    submit(engine, policy, agent, PROMPT, now=0.0)
    context = finish(engine, policy, agent, now=0.0)
    assert policy.ttl(engine, agent) == 0.0
    # ... until its calls are seen to return within 0.05 s.
    for i in range(1, 6):
        agent.ready_at = i - 0.95
        submit(engine, policy, agent, [*context, i], now=agent.ready_at)
        context = finish(engine, policy, agent, now=float(i))
    assert policy.durations.num_records("run_command") == 5
    assert policy.ttl(engine, agent) == pytest.approx(0.05)


def test_calls_keep_their_programs_arrival_and_a_pinned_call_goes_first(
    engine: Engine,
) -> None:
    policy = TtlPin(CHEAP)
    old = make_agent(engine, "old", expected_s=1.0, started_at=0.0)
    new = make_agent(engine, "new", expected_s=1.0, started_at=5.0)
    # The newer program's call is sent first; the older program's still goes first.
    submit(engine, policy, new, PROMPT, now=6.0)
    submit(engine, policy, old, PROMPT[:100], now=7.0)
    assert policy.order_time(old) == 0.0
    queue = sorted(engine.scheduler.waiting, key=Request.sort_key)
    assert [r.budget for r in queue] == [old.budget, new.budget]
    finish(engine, policy, old, now=8.0)
    finish(engine, policy, new, now=8.0)
    # A call whose pin is resident goes before the older program's unpinned one.
    pinned = TtlPin(Costs(prefill_s_per_token=1e-3, swap_s_per_block=1.0))
    pinned.on_idle(engine, new, now=8.0)
    assert new.budget in engine.retained.held_budgets()
    assert not engine.retained.is_offloaded(new.budget)
    new.ready_at = 8.1
    submit(engine, pinned, new, PROMPT, now=8.1)
    submit(engine, pinned, old, PROMPT[:100], now=8.2)
    assert (pinned.priority(new), pinned.priority(old)) == (1, 0)
    queue = sorted(engine.scheduler.waiting, key=Request.sort_key)
    assert [r.budget for r in queue] == [new.budget, old.budget]
    finish(engine, pinned, new, now=9.0)
    finish(engine, pinned, old, now=9.0)


def test_an_expired_pin_goes_to_host_and_comes_back_before_the_next_call(
    engine: Engine,
) -> None:
    # Reload from host: 13 blocks x 0.1 s; a 0.2 s tool is worth pinning.
    policy = TtlPin(Costs(prefill_s_per_token=1e-2, swap_s_per_block=0.1))
    agent = make_agent(engine, "a", expected_s=0.2)
    submit(engine, policy, agent, PROMPT, now=0.0)
    context = finish(engine, policy, agent, now=1.0)
    tau = policy.ttl(engine, agent)
    assert tau > 0.2
    assert engine.retained.held_budgets() == {agent.budget}
    policy.tick(engine, now=1.0 + tau / 2)
    assert not engine.retained.is_offloaded(agent.budget)  # within its TTL
    policy.tick(engine, now=1.0 + tau)
    assert engine.retained.is_offloaded(agent.budget)
    assert (policy.num_offloaded, policy.num_dropped) == (1, 0)
    assert engine.metrics().num_blocks_in_use == 0  # the device holds none of it
    engine.reset_prefix_cache()  # its device copies are gone: only the host has it
    agent.ready_at = 30.0
    swapped_in = engine.metrics().num_blocks_swapped_in
    policy.before_call(engine, agent)
    assert not engine.retained.is_offloaded(agent.budget)  # restored before the call is sent
    agent.request_id = engine.add_request([*context, 5], SAMPLING, budget=agent.budget)
    assert engine.metrics().num_blocks_swapped_in - swapped_in == 12
    recomputed = engine.metrics().num_recomputed_tokens
    finish(engine, policy, agent, now=31.0)
    # Only the tail past its 12 full blocks is computed again (a hold keeps full blocks).
    assert engine.metrics().num_recomputed_tokens - recomputed == len(context) - 1 - 12 * 16


def test_an_expired_pin_is_dropped_when_the_host_is_full(cramped: Engine) -> None:
    for engine in _clean(cramped):
        # No host room: the reload is a recompute, 204 x 10 ms; a 0.2 s tool is pinned.
        policy = TtlPin(Costs(prefill_s_per_token=1e-2, swap_s_per_block=1e-4))
        agent = make_agent(engine, "a", expected_s=0.2)
        submit(engine, policy, agent, PROMPT, now=0.0)
        finish(engine, policy, agent, now=1.0)
        tau = policy.ttl(engine, agent)
        assert tau > 0.2
        assert engine.retained.held_budgets() == {agent.budget}
        policy.tick(engine, now=1.0 + tau)
        assert engine.retained.held_budgets() == frozenset()
        assert (policy.num_offloaded, policy.num_dropped) == (0, 1)
        assert engine.metrics().num_blocks_in_use == 0
        assert engine.metrics().num_blocks_cached >= 12  # evictable, still reusable


def test_memoryfulness_follows_the_finished_programs_lengths(engine: Engine) -> None:
    policy = TtlPin(CHEAP)
    assert policy.memoryfulness == 1.0  # the paper's cold start
    agents = [make_agent(engine, f"p{i}", expected_s=1.0) for i in range(3)]
    for agent, calls in zip(agents, (3, 3, 2), strict=True):
        policy.before_call(engine, agent)
        agent.turn, agent.state = calls - 1, AgentState.DONE
    policy.tick(engine, now=0.0)
    # (k, N - k): (1, 2), (2, 1) twice and (1, 1): less than fully memoryful.
    assert 0.0 < policy.memoryfulness < 1.0


@pytest.mark.parametrize(
    ("knobs", "word"),
    [
        ({"num_prior_samples": 0}, "num_prior_samples"),
        ({"prior_mean_s": 0.0}, "prior_mean_s"),
        ({"queue_window": 0}, "queue_window"),
    ],
)
def test_bad_knobs_are_refused_with_what_to_set(knobs: dict[str, float], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        TtlPin(CHEAP, **knobs)  # type: ignore[arg-type]
