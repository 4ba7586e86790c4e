"""InferCept as the swarm benchmark's baseline (``Intercept``), rule by rule, on the real
engine (tiny-random, CPU, small pools): a resumed call keeps its program's arrival,
``C_others`` counts every block other requests hold on the device, one iteration swaps
out no more than its compute hides, and preserved contexts are swapped or discarded when
the device runs short and their waste favours it. Each test ends with every block back.

The costs are given, not measured, so the waste each choice weighs is known to the digit.
"""

from __future__ import annotations

import math

import pytest

from engine import Engine, EngineConfig, SamplingParams
from kvgov.benchmarks.baselines import Costs, Intercept
from kvgov.benchmarks.swarm.result import RunResult
from kvgov.benchmarks.swarm.runner import Agent, AgentState, SwarmRunner
from kvgov.benchmarks.swarm.workload import AgentScript, Turn

SAMPLING = SamplingParams(max_tokens=4, temperature=0.0)
BLOCK = 16


@pytest.fixture(scope="module")
def engine() -> Engine:
    """On the CPU (its copies overlap nothing), 48 blocks, and room for one running
    request: whichever the scheduler's order puts first runs first."""
    return Engine(EngineConfig(device="cpu", num_blocks=48, max_num_seqs=1))


def tokens(n: int, seed: int) -> list[int]:
    """``n`` token ids no other seed's prompt shares a block with."""
    return [(i * 7919 + seed * 104_729) % 50_000 + 1 for i in range(n)]


def agent(name: str, index: int, *, expected_s: float, started_at: float = 0.0) -> Agent:
    turn = Turn(({"role": "user", "content": name},), "run_command", expected_s, expected_s)
    last = Turn(({"role": "user", "content": name},), None, 0.0, 0.0)
    script = AgentScript(name, index, True, (turn, last), started_at)
    return Agent(script, index, f"agent-{name}", AgentState.IDLE, started_at=started_at)


def call_ended(engine: Engine, a: Agent, prompt: list[int]) -> None:
    """``a``'s call ran and ended in a tool call, as the runner hands it to a policy."""
    engine.open_budget(a.budget, engine.capacity().num_blocks)
    done = engine.generate(prompt, SAMPLING, budget=a.budget)[0]
    a.context_tokens = len(done.prompt_token_ids) + len(done.token_ids)


def close(engine: Engine, *budgets: str) -> None:
    """Every budget closed: nothing of theirs may stay on the device or the host."""
    for request in [*engine.scheduler.waiting, *engine.scheduler.running]:
        engine.abort(request.request_id)
        engine.pop_completion(request.request_id)
    opened = {budget.name for budget in engine.block_manager.budgets}
    for budget in opened.intersection(budgets):  # a test that failed early opened fewer
        engine.close_budget(budget)
    assert engine.metrics().num_blocks_in_use == 0
    assert engine.block_manager.host_pool.num_in_use == 0
    engine.reset_prefix_cache()


def test_a_resumed_call_goes_before_a_call_of_a_program_that_arrived_later(
    engine: Engine,
) -> None:
    """InferCept keeps a resumed request's original arrival: A's program arrived at 0 s,
    B's at 1 s; B's first call is queued at 2 s, A's call after its tool at 2.5 s, and
    with room for one request, A's runs first (queued as new, B's would)."""
    a = agent("a", 0, expected_s=1.0, started_at=0.0)
    b = agent("b", 1, expected_s=1.0, started_at=1.0)
    a.turn, b.turn = 1, 0  # a resumes after its tool; b makes its first call
    prompts = {("a", 1): tokens(40, 1), ("b", 0): tokens(40, 2)}
    policy = Intercept(Costs(prefill_s_per_token=1e-3, swap_s_per_block=1e-4))
    runner = SwarmRunner(engine, [a.script, b.script], prompts, policy, reply_tokens=4)
    runner.agents = [a, b]
    result = RunResult("intercept", 1.0, 48, engine.kv_cache.bytes_per_block)
    for x in (a, b):
        engine.open_budget(x.budget, 48)
    try:
        runner._submit(b, result, 2.0)  # the runner's own submission and time conversion
        runner._submit(a, result, 2.5)
        assert result.failed == []
        engine.step()
        assert [r.budget for r in engine.scheduler.running] == [a.budget]
    finally:
        close(engine, a.budget, b.budget)


def test_c_others_counts_the_running_and_the_retained_blocks_of_other_requests(
    engine: Engine,
) -> None:
    idle, held = agent("idle", 0, expected_s=1.0), agent("held", 1, expected_s=1.0)
    call_ended(engine, held, tokens(100, 3))
    engine.retain(held.budget)
    call_ended(engine, idle, tokens(200, 4))
    engine.open_budget("agent-running", 48)
    running = engine.add_request(
        tokens(60, 5), SamplingParams(max_tokens=50), budget="agent-running"
    )
    engine.step()  # its prompt computed: it holds its blocks, running
    try:
        num_running = len(engine.block_manager.block_ids(running))
        num_held = engine.retained.num_host_blocks_needed(held.budget)
        assert num_running == 4 and num_held == 6
        policy = Intercept(Costs(prefill_s_per_token=1e-3, swap_s_per_block=1.0))
        others = policy.num_other_blocks(engine, idle.budget)
        assert others == num_running + num_held
        # Its own blocks are only cached now; a count of the pool's in-use blocks less
        # its own would leave out 13 of the others'.
        c = math.ceil(idle.context_tokens / BLOCK)
        assert c == 13 and engine.metrics().num_blocks_in_use - c == others - c
        # The tool's time makes keeping it cost between discarding it priced with the
        # undercount and with the true count: the true count keeps it.
        recompute_s = idle.context_tokens * 1e-3
        idle.script = agent("idle", 0, expected_s=recompute_s * (others + c / 2) / c).script
        policy.on_idle(engine, idle, now=0.0)
        assert policy.decisions == {"keep": 1}
        assert engine.retained.held_budgets() == {held.budget, idle.budget}
    finally:
        close(engine, idle.budget, held.budget, "agent-running")


def test_one_iteration_swaps_out_no_more_than_its_compute_hides(engine: Engine) -> None:
    """A 20 ms step hides 20 blocks of 1 ms each: of three 13-block contexts that go idle
    in one iteration, one is swapped; the next iteration swaps another."""
    costs = Costs(prefill_s_per_token=1e-3, swap_s_per_block=1e-3)
    policy = Intercept(costs, copies_overlap=True, step_s=0.02)
    assert policy.swap_limit(engine) == 20
    agents = [agent(f"w{i}", i, expected_s=30.0) for i in range(4)]
    before = engine.metrics().num_blocks_swapped_out
    try:
        for i, a in enumerate(agents[:3]):  # one iteration: no tick between them
            call_ended(engine, a, tokens(200, 10 + i))
            policy.on_idle(engine, a, now=0.0)
        assert engine.metrics().num_blocks_swapped_out - before == 12  # 12 full blocks
        offloaded = [a.budget for a in agents[:3] if engine.retained.is_offloaded(a.budget)]
        assert offloaded == [agents[0].budget]
        # Beyond the limit, preserve or discard by waste: a 30 s tool costs 390
        # block-seconds held, recomputing 204 tokens 0.2 x (13 + 12 held) about 5.
        assert policy.decisions == {"swap": 1, "discard": 2}
        policy.tick(engine, now=0.01)  # the next iteration
        call_ended(engine, agents[3], tokens(200, 13))
        policy.on_idle(engine, agents[3], now=0.01)
        assert engine.retained.is_offloaded(agents[3].budget)
        policy.tick(engine, now=0.02)
        assert policy.swapped_blocks == [12, 12]  # each iteration's, at its last tick
    finally:
        close(engine, *(a.budget for a in agents))


@pytest.mark.parametrize(
    ("overlap", "step_s"),
    [(None, 0.02), (True, None)],
    ids=["on the CPU", "no step timed yet"],
)
def test_where_no_copy_is_hidden_a_swap_is_priced_in_full(
    engine: Engine, overlap: bool | None, step_s: float | None
) -> None:
    """The CPU's copies are a memcpy between steps; where copies overlap, none is known
    hidden before a step is timed. Either way the limit is 0 and a swap is one choice
    among three, at its full waste."""
    costs = Costs(prefill_s_per_token=1e-3, swap_s_per_block=1e-3)
    policy = Intercept(costs, copies_overlap=overlap, step_s=step_s)
    assert policy.swap_limit(engine) == 0
    a = agent("a", 0, expected_s=30.0)
    call_ended(engine, a, tokens(200, 20))
    try:
        # 2 x 13 ms x 13 blocks = 0.34 block-s to swap; 2.65 to recompute; 390 to keep.
        policy.on_idle(engine, a, now=0.0)
        assert policy.decisions == {"swap": 1}
        assert engine.retained.is_offloaded(a.budget)
    finally:
        close(engine, a.budget)


@pytest.mark.gpu
def test_on_cuda_an_iterations_compute_hides_its_swaps() -> None:
    """The engine copies on a side stream there: by default a 20 ms step hides 20 blocks
    of 1 ms each."""
    cuda = Engine(EngineConfig(device="cuda", num_blocks=48))
    policy = Intercept(Costs(prefill_s_per_token=1e-3, swap_s_per_block=1e-3), step_s=0.02)
    assert policy.overlaps(cuda) and policy.swap_limit(cuda) == 20


def test_a_step_is_timed_between_the_runners_ticks(engine: Engine) -> None:
    policy = Intercept(Costs(prefill_s_per_token=1e-3, swap_s_per_block=0.25), copies_overlap=True)
    engine.open_budget("agent-r", 48)
    engine.add_request(tokens(20, 30), SamplingParams(max_tokens=50), budget="agent-r")
    try:
        assert policy.swap_limit(engine) == 0  # no step timed yet
        policy.tick(engine, now=1.0)
        policy.tick(engine, now=1.5)  # a request was unfinished: one step between
        assert policy.swap_limit(engine) == 2  # 0.5 s hides two 0.25 s blocks
    finally:
        close(engine, "agent-r")


@pytest.mark.parametrize("later", ["discard later", "swap later"])
def test_a_preserved_context_is_moved_when_the_device_runs_short(
    engine: Engine, later: str
) -> None:
    """Kept while its waste said so; when a waiting request lacks blocks and the waste
    now favours moving it, the next tick discards it (the batch that made recomputing
    it dear has finished) or swaps it (a new iteration's limit has room for it)."""
    # Keeping it costs 0.3 s x 13 = 3.9 block-s, or 0.1 s x 13 = 1.3.
    kept = agent("kept", 0, expected_s=0.3 if later == "discard later" else 0.1)
    call_ended(engine, kept, tokens(200, 40))
    engine.open_budget("agent-other", 48)
    engine.open_budget("agent-waiting", 48)
    budgets = [kept.budget, "agent-other", "agent-waiting"]
    if later == "discard later":
        # Recomputing it while a 20-block batch runs: 0.204 s x 33 = 6.7 block-s.
        policy = Intercept(Costs(prefill_s_per_token=1e-3, swap_s_per_block=1.0))
        other = engine.add_request(
            tokens(300, 41), SamplingParams(max_tokens=50), budget="agent-other"
        )
        engine.step()
    else:
        # Another context takes this iteration's 20 hidden blocks first; recomputing
        # this one would cost 0.204 s x 13 = 2.65 block-s.
        policy = Intercept(
            Costs(prefill_s_per_token=1e-3, swap_s_per_block=1e-3), copies_overlap=True, step_s=0.02
        )
        swapped = agent("swapped", 1, expected_s=30.0)
        call_ended(engine, swapped, tokens(200, 42))
        budgets.append(swapped.budget)
        policy.on_idle(engine, swapped, now=0.0)
    try:
        policy.on_idle(engine, kept, now=0.0)
        assert policy.decisions["keep"] == 1
        if later == "discard later":
            engine.abort(other)  # the batch finished: recomputing it costs 0.204 x 13 = 2.65
            engine.pop_completion(other)
        policy.tick(engine, now=0.0)
        assert engine.retained.held_budgets() >= {kept.budget}  # no request is short yet
        assert not engine.retained.is_offloaded(kept.budget)
        engine.add_request(tokens(640, 43), SAMPLING, budget="agent-waiting")  # 40 blocks
        policy.tick(engine, now=0.0)
        assert policy.decisions.get(later) == 1
        if later == "discard later":
            assert kept.budget not in engine.retained.held_budgets()
        else:
            assert engine.retained.is_offloaded(kept.budget)
        engine.step()
        assert [r.budget for r in engine.scheduler.running] == ["agent-waiting"]
    finally:
        close(engine, *budgets)


def test_knobs_out_of_range_say_what_to_give() -> None:
    costs = Costs(prefill_s_per_token=1e-3, swap_s_per_block=1e-3)
    with pytest.raises(ValueError, match="step_s is one iteration's compute"):
        Intercept(costs, step_s=0.0)
    with pytest.raises(ValueError, match="copies_overlap must be True, False or None"):
        Intercept(costs, copies_overlap="yes")  # type: ignore[arg-type]
    assert Intercept(costs).name == "intercept"  # the benchmark's figures are keyed by it


def test_under_pressure_the_longest_remaining_tool_is_moved_first(engine: Engine) -> None:
    """The paper's order: of two preserved contexts that would both be discarded now, the
    one whose tool has longer to run goes first, and it alone covers the shortfall."""
    soon, late = agent("soon", 0, expected_s=0.45), agent("late", 1, expected_s=0.6)
    call_ended(engine, soon, tokens(200, 50))
    call_ended(engine, late, tokens(200, 51))
    engine.open_budget("agent-other", 48)
    engine.open_budget("agent-waiting", 48)
    budgets = [soon.budget, late.budget, "agent-other", "agent-waiting"]
    policy = Intercept(Costs(prefill_s_per_token=1e-3, swap_s_per_block=1.0))
    other = engine.add_request(tokens(300, 52), SamplingParams(max_tokens=50), budget="agent-other")
    engine.step()
    try:
        # Kept beside a 20-block batch: soon 5.85 block-s kept < 0.204 x 33 = 6.7 to
        # recompute; late 7.8 < 0.204 x (13 + 20 + soon's 12) = 9.2.
        policy.on_idle(engine, soon, now=0.0)
        policy.on_idle(engine, late, now=0.0)
        assert policy.decisions == {"keep": 2}
        engine.abort(other)  # now each costs 0.204 x 25 = 5.1 to recompute: both would go
        engine.pop_completion(other)
        engine.add_request(tokens(480, 53), SAMPLING, budget="agent-waiting")  # 6 short
        policy.tick(engine, now=0.0)
        assert policy.decisions == {"keep": 2, "discard later": 1}
        assert engine.retained.held_budgets() == {soon.budget}
    finally:
        close(engine, *budgets)


def test_a_context_is_re_weighed_with_its_tools_remaining_time(engine: Engine) -> None:
    """Kept for a 0.4 s tool beside a 20-block batch (5.2 block-s kept < 0.204 x 33 = 6.7
    to recompute); the batch ends and a request is short. 0.3 s on, the tool has 0.1 s
    left: 1.3 block-s kept < 0.204 x 13 = 2.65 to recompute, so it stays (priced on the
    whole 0.4 s it would be discarded)."""
    soon = agent("soon", 0, expected_s=0.4)
    call_ended(engine, soon, tokens(200, 60))
    engine.open_budget("agent-other", 48)
    engine.open_budget("agent-waiting", 48)
    budgets = [soon.budget, "agent-other", "agent-waiting"]
    policy = Intercept(Costs(prefill_s_per_token=1e-3, swap_s_per_block=1.0))
    other = engine.add_request(tokens(300, 61), SamplingParams(max_tokens=50), budget="agent-other")
    engine.step()
    try:
        policy.on_idle(engine, soon, now=0.0)
        assert policy.decisions == {"keep": 1}
        engine.abort(other)
        engine.pop_completion(other)
        engine.add_request(tokens(640, 62), SAMPLING, budget="agent-waiting")  # 4 short
        policy.tick(engine, now=0.3)
        assert policy.decisions == {"keep": 1}
        assert engine.retained.held_budgets() == {soon.budget}
    finally:
        close(engine, *budgets)
