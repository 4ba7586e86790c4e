"""The baselines' runner on the real engine: each call generates the tokens its turn asks
for (the open-loop workload's replies are 100-300 tokens, drawn per call)."""

from __future__ import annotations

from engine import Engine, EngineConfig
from kvgov.benchmarks.baselines import make_baseline
from kvgov.benchmarks.swarm.result import RunResult
from kvgov.benchmarks.swarm.runner import SwarmRunner
from kvgov.benchmarks.swarm.workload import AgentScript, Turn


def test_each_call_generates_its_turns_reply_tokens_or_the_runners() -> None:
    engine = Engine(EngineConfig(model="tiny-random", device="cpu", num_blocks=64))
    system = ({"role": "system", "content": "team 0"},)
    planner = AgentScript(
        "t0-planner",
        0,
        True,
        (Turn(system, "fanout", 0.0, 0.0, reply_tokens=2), Turn(system, None, 0.0, 0.0)),
        0.0,
    )
    worker = AgentScript(
        "t0-w0",
        0,
        False,
        (Turn(system, "grep", 0.01, 0.01, reply_tokens=7), Turn(system, None, 0.0, 0.0, 5)),
        0.0,
    )
    prompts = {(s.name, i): [11 + i, 12, 13] for s in (planner, worker) for i in range(2)}
    generated: dict[str, int] = {}
    add_request = engine.add_request

    def recorded(prompt, sampling, **options):  # type: ignore[no-untyped-def]
        request_id = add_request(prompt, sampling, **options)
        generated[request_id] = sampling.max_tokens
        return request_id

    engine.add_request = recorded  # type: ignore[method-assign]
    policy = make_baseline("paged", None)
    runner = SwarmRunner(engine, [planner, worker], prompts, policy, reply_tokens=3)
    result = RunResult("paged", 1.0, 64, 0)
    runner.drive(result, deadline_s=60.0)
    assert result.failed == [] and len(result.jct_s) == 2
    # planner: 2 then the runner's 3; worker: 7 then 5, in the order the calls were sent
    assert sorted(generated.values()) == [2, 3, 5, 7]
