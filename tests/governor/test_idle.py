"""Idle agents: parking on tool calls and fan-out, KV held between calls, offloaded under
pressure and restored, with real threads and asyncio, on FakeBackend and on the bundled
engine (tiny-random, real forward passes)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from backends import LocalBackend
from backends.remote.backend import RemoteBackend
from governor import (
    AdmissionMode,
    AdmissionTimeout,
    AgentSpec,
    Governor,
    GovernorConfig,
    GovernorEvent,
    LeaseState,
    Policies,
)
from governor.testing import FakeBackend
from policies import ExtractiveSummarizer, SummarizeOldest

PLANNER = AgentSpec(name="planner", ceiling_tokens=1_600, max_fanout=3)
WORKER = AgentSpec(name="worker", ceiling_tokens=1_600)
AGENT = AgentSpec(name="agent", ceiling_tokens=800)
Served = LocalBackend | RemoteBackend  # the bundled engine, in process or behind kvgov serve
TASK = [{"role": "user", "content": "Find the failing test and explain it in one line."}]


def _recorder(governor: Governor) -> list[GovernorEvent]:
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    return events


def _kinds(events: list[GovernorEvent]) -> list[str]:
    return [e.kind for e in events]


@pytest.fixture(scope="module", params=["local", "remote"])
def backend(request: pytest.FixtureRequest) -> Iterator[Served]:
    """The bundled engine with a small pool (64 blocks of 16 tokens) and host room, in
    process or behind a kvgov serve process (the same pool): the behaviour is the same."""
    if request.param == "remote":
        server = request.getfixturevalue("kvgov_server")
        assert server.config == {"num_blocks": 64, "block_size": 16}
        made: Served = RemoteBackend(server.base_url)
    else:
        made = LocalBackend(config={"num_blocks": 64, "block_size": 16})
    yield made
    made.close()


def _assert_released(backend: Served | FakeBackend) -> None:
    m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_blocks_swapped) == (m.num_blocks_pinned, 0)


# -- parking --------------------------------------------------------------------------
def test_parking_lets_a_planner_and_its_workers_fit_where_admission_alone_cannot() -> None:
    """Room for two leases of 1,600 tokens: a planner that stays active leaves room for
    one worker at a time, and a second worker that must run beside the first never
    gets in; parked while its children run, the planner makes room for both."""
    backend = FakeBackend(num_blocks=224, block_size=16)  # floor(224 * 0.9 / 100) = 2
    config = GovernorConfig(admission_timeout_s=0.3)
    governor = Governor(backend, config=config, agents=[PLANNER, WORKER])
    both_running = threading.Barrier(2, timeout=5)

    def worker(lease_context: object) -> None:
        with lease_context as lease:  # type: ignore[attr-defined]
            governor.complete(lease, TASK, max_tokens=8)
            both_running.wait()  # the two workers must be active at the same time

    with governor.lease("planner") as planner:
        governor.complete(planner, TASK, max_tokens=8)
        # Without parking: plain leases beside the active planner.
        first = governor.lease("worker")
        with first as lease_a:
            with pytest.raises(AdmissionTimeout), governor.lease("worker"):
                pass
            assert lease_a.state is LeaseState.ACTIVE
        # With parking: children of the planner, which is parked while they run.
        threads = [
            threading.Thread(target=worker, args=(child,))
            for child in governor.fanout(planner, "worker", 2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        assert not both_running.broken
        assert planner.state is LeaseState.PARKED
        governor.complete(planner, TASK, max_tokens=8)  # resumes once they are done
        assert planner.state is LeaseState.ACTIVE
    assert governor.admission.counts()[:2] == (0, 0)
    _assert_released(backend)


def test_a_long_tool_call_parks_its_lease_after_park_after_s() -> None:
    backend = FakeBackend(num_blocks=112, block_size=16)  # one lease of 1,600 at a time
    config = GovernorConfig(park_after_s=0.05, admission_timeout_s=5)
    governor = Governor(backend, config=config, agents=[WORKER])
    events = _recorder(governor)
    order: list[str] = []

    def other() -> None:
        with governor.lease("worker") as lease:
            order.append("other admitted")
            governor.complete(lease, TASK, max_tokens=4)

    with governor.lease("worker") as lease:
        governor.complete(lease, TASK, max_tokens=4)
        with governor.tool_call(lease, "run_tests", {"path": "tests/"}):
            thread = threading.Thread(target=other)
            thread.start()
            thread.join(timeout=5)  # admitted only once this lease is parked
            order.append("tool returned")
            assert lease.state is LeaseState.PARKED
            assert lease.tool == "run_tests"
        assert lease.tool is None
        governor.complete(lease, TASK, max_tokens=4)
    assert order == ["other admitted", "tool returned"]
    parked = [e for e in events if e.kind == "parked"]
    assert parked[0].attributes == {"reason": "tool"} and parked[0].agent == "worker"
    assert "resumed" in _kinds(events)
    _assert_released(backend)


def test_a_quick_tool_call_is_not_parked() -> None:
    governor = Governor(FakeBackend(), config=GovernorConfig(park_after_s=5), agents=[WORKER])
    with governor.lease("worker") as lease:
        with governor.tool_call(lease, "ls"):
            pass
        assert lease.state is LeaseState.ACTIVE


def test_an_agent_idle_between_calls_is_parked_in_time_and_holds_no_kv() -> None:
    backend = FakeBackend(num_blocks=112, block_size=16)  # one lease of 1,600 at a time
    config = GovernorConfig(park_after_s=0.05, admission_timeout_s=5)
    governor = Governor(backend, config=config, agents=[WORKER])
    events = _recorder(governor)
    with governor.lease("worker") as lease:
        governor.complete(lease, TASK, max_tokens=4)
        governor.between_calls(lease)  # and then nothing: its caller went away
        with governor.lease("worker") as other:  # admitted once the first is parked
            assert lease.state is LeaseState.PARKED
            governor.complete(other, TASK, max_tokens=4)
        governor.complete(lease, TASK, max_tokens=4)  # back: resumed for its next call
    parked = [e.attributes for e in events if e.kind == "parked"]
    assert parked == [{"reason": "turn"}]
    assert "retained" not in _kinds(events)  # nothing held for an agent that may be gone
    _assert_released(backend)


def test_a_call_or_tool_soon_after_keeps_the_lease_active() -> None:
    governor = Governor(FakeBackend(), config=GovernorConfig(park_after_s=5), agents=[WORKER])
    events = _recorder(governor)
    with governor.lease("worker") as lease:
        governor.complete(lease, TASK, max_tokens=4)
        governor.between_calls(lease)
        with governor.tool_call(lease, "ls"):
            pass
        governor.complete(lease, TASK, max_tokens=4)
        governor.between_calls(lease)
        assert lease.state is LeaseState.ACTIVE
    assert "parked" not in _kinds(events)
    time.sleep(0.01)
    assert governor.idle._idle == {}  # released: no idle period or timer left behind


# -- retention, offload, restore on the bundled engine ----------------------------------
def _turns(governor: Governor, *, flood: bool) -> tuple[list[int], list[int]]:
    """Two turns of one agent with a tool call between them; with ``flood``, other
    agents fill the pool while the tool runs. Greedy token ids of both replies, and the
    second call's cached prompt tokens as the last item of the second list."""
    with governor.lease("agent") as lease:
        first = governor.complete(lease, TASK, max_tokens=12)
        history = [*TASK, {"role": "assistant", "content": first.text}]
        with governor.tool_call(lease, "grep", {"pattern": "FAILED"}) as call:
            if flood:
                _flood(governor)
            output = call.reduce("tests/test_api.py::test_login FAILED\n" * 3)
        history.append({"role": "user", "content": output.text})
        second = governor.complete(lease, history, max_tokens=12)
    return list(first.token_ids), [*second.token_ids, second.cached_tokens]


def _flood(governor: Governor) -> None:
    """Other agents' calls through the whole pool (each a new prompt)."""
    for i in range(4):
        with governor.lease("agent") as other:
            words = " ".join(f"w{i}x{j}" for j in range(120))
            governor.complete(other, [{"role": "user", "content": words}], max_tokens=4)


def test_held_kv_survives_other_agents_and_is_reused(backend: Served) -> None:
    config = GovernorConfig(park_after_s=0, retain_s=30, pressure_watermark=1.0)
    governor = Governor(backend, config=config, agents=[AGENT])
    events = _recorder(governor)
    _, second = _turns(governor, flood=True)
    retained = [e for e in events if e.kind == "retained"]
    assert len(retained) == 1 and retained[0].attributes["tokens"] > 0
    assert second[-1] >= retained[0].attributes["tokens"]  # every held token was a hit
    _assert_released(backend)


def test_without_retention_the_context_is_recomputed(backend: Served) -> None:
    config = GovernorConfig(park_after_s=0, retain_s=0)
    governor = Governor(backend, config=config, agents=[AGENT])
    events = _recorder(governor)
    _, second = _turns(governor, flood=True)
    assert "retained" not in _kinds(events)
    assert second[-1] == 0  # the flood evicted it
    _assert_released(backend)


def test_offload_under_pressure_and_restore_keep_greedy_outputs(backend: Served) -> None:
    plain = Governor(backend, config=GovernorConfig(retain_s=0), agents=[AGENT])
    expected_first, expected_second = _turns(plain, flood=False)
    # A watermark this low means pressure at every hold: the KV goes to host at once.
    config = GovernorConfig(park_after_s=0, retain_s=30, pressure_watermark=0.01)
    governor = Governor(backend, config=config, agents=[AGENT])
    events = _recorder(governor)
    first, second = _turns(governor, flood=True)
    assert first == expected_first
    assert second[:-1] == expected_second[:-1]  # identical greedy tokens after the round trip
    kinds = _kinds(events)
    assert kinds.index("retained") < kinds.index("pressure") < kinds.index("offloaded")
    assert kinds.index("offloaded") < kinds.index("restored")
    offloaded = next(e for e in events if e.kind == "offloaded")
    assert offloaded.attributes["blocks"] > 0
    assert "priority 0, parked" in offloaded.attributes["reason"]
    held = next(e for e in events if e.kind == "retained").attributes["tokens"]
    assert second[-1] >= held  # restored from host into the prefix cache, then hit
    _assert_released(backend)


def test_a_hold_goes_to_host_after_retain_s(backend: Served) -> None:
    """retain_s is up while the tool still runs: the context leaves the device for host
    memory (a copy, not a prefill again, when the next call comes)."""
    config = GovernorConfig(park_after_s=0, retain_s=0.05, pressure_watermark=1.0)
    governor = Governor(backend, config=config, agents=[AGENT])
    events = _recorder(governor)
    with governor.lease("agent") as lease:
        governor.complete(lease, TASK, max_tokens=12)
        with governor.tool_call(lease, "sleep"):
            deadline = time.monotonic() + 5
            while "offloaded" not in _kinds(events):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert lease.num_retained_tokens > 0 and lease.kv_offloaded
            m = backend.metrics()
            assert m.num_blocks_in_use == m.num_blocks_pinned and m.num_blocks_swapped > 0
    _assert_released(backend)  # released with the lease, host copy included
    offloaded = next(e for e in events if e.kind == "offloaded")
    assert "retain_s=0.05" in offloaded.attributes["reason"]


def test_a_tool_expected_to_run_long_holds_its_context_on_host(backend: Served) -> None:
    """A wait expected past retain_s is not worth device blocks but is worth host memory:
    the context is offloaded as it is held, and the next call restores it instead of
    computing it again."""
    config = GovernorConfig(park_after_s=0, retain_s=2, pressure_watermark=1.0)
    governor = Governor(backend, config=config, agents=[AGENT])
    events = _recorder(governor)
    with governor.lease("agent") as lease:
        governor.complete(lease, TASK, max_tokens=12)
        with governor.tool_call(lease, "build", expected_s=60):
            assert lease.num_retained_tokens > 0 and lease.kv_offloaded
            m = backend.metrics()
            assert m.num_blocks_in_use == m.num_blocks_pinned  # none on the device
            assert m.num_blocks_swapped > 0  # on host
        offloaded = [e for e in events if e.kind == "offloaded"]
        assert (
            len(offloaded) == 1 and "expected past retain_s=2" in offloaded[0].attributes["reason"]
        )
        hits = backend.metrics().prefix_cache_hits
        governor.complete(lease, [*TASK, {"role": "user", "content": "And?"}], max_tokens=4)
        # Restored, not computed again: the next call found its context's full blocks.
        assert backend.metrics().prefix_cache_hits - hits >= 16
        assert "restored" in _kinds(events)
        with governor.tool_call(lease, "ls", expected_s=0.1):
            assert lease.num_retained_tokens > 0 and not lease.kv_offloaded
    _assert_released(backend)


def test_the_engine_holds_a_calls_context_as_it_finishes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In process, the engine holds a call's context in the step that finishes it, so no
    other request's allocation evicts it before a tool call holds it; the tool call keeps
    that hold as it is, with no call to the engine; a next call takes it over; release
    ends it."""
    backend = LocalBackend(config={"num_blocks": 64, "block_size": 16})
    retains: list[str] = []
    retain = backend.retain
    monkeypatch.setattr(
        backend, "retain", lambda *, budget: retains.append(budget) or retain(budget=budget)
    )
    try:
        for retain_s, held in ((30, True), (0, False)):
            config = GovernorConfig(park_after_s=0, retain_s=retain_s)
            governor = Governor(backend, config=config, agents=[AGENT])
            with governor.lease("agent") as lease:
                governor.complete(lease, TASK, max_tokens=12)
                m = backend.metrics()
                assert m.num_requests_running == 0
                assert (m.num_blocks_in_use > 0) is held  # the context's full blocks
                in_use = m.num_blocks_in_use
                with governor.tool_call(lease, "ls"):
                    if held:
                        assert lease.num_retained_blocks == in_use
                        assert backend.metrics().num_blocks_in_use == in_use
                governor.complete(lease, TASK, max_tokens=12)
            _assert_released(backend)
            assert retains == []  # held at finish, or not held at all: retain never called
    finally:
        backend.close()


def test_releasing_a_lease_with_offloaded_kv_returns_everything(backend: Served) -> None:
    config = GovernorConfig(park_after_s=0, retain_s=30, pressure_watermark=0.01)
    governor = Governor(backend, config=config, agents=[AGENT])

    async def agent() -> None:
        async with governor.lease("agent") as lease:
            await governor.acomplete(lease, TASK, max_tokens=12)
            async with governor.tool_call(lease, "grep"):
                assert lease.kv_offloaded
                assert backend.metrics().num_blocks_swapped > 0
                raise RuntimeError("the tool crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        asyncio.run(agent())
    _assert_released(backend)


def test_held_kv_of_parked_agents_never_deadlocks_a_tight_pool() -> None:
    """The shape of examples/swarm.py at 80 blocks, which hung now and then before: in
    overcommit, with 8 workers fanned out 3 at a time and parked 50 ms into each tool call
    with their KV held, parked leases queued behind running ones held blocks the running
    ones' calls needed, and the engine spun on a request it could never schedule. Holds
    now end after retain_s whatever the tool does, and the engine ends the oldest hold
    itself when nothing can run (tests/engine/test_retention.py pins that down)."""
    backend = LocalBackend(config={"num_blocks": 80})
    planner = AgentSpec(name="planner", ceiling_tokens=384, max_fanout=3)
    worker = AgentSpec(name="worker", ceiling_tokens=512, tool_output_tokens=192, prefix="sys")
    config = GovernorConfig(
        mode=AdmissionMode.OVERCOMMIT, park_after_s=0.05, pressure_watermark=0.6
    )
    policies = Policies(
        tool_output=ExtractiveSummarizer(backend.counter),
        ceiling=SummarizeOldest(summary_tokens=96),
    )
    governor = Governor(backend, config=config, agents=[planner, worker], policies=policies)
    governor.register_prefix("sys", "You are a careful build engineer. " * 6)
    log = "".join(f"tests/test_{i}.py::test_case FAILED - KeyError {i * 7919}\n" for i in range(90))

    async def work(child: object, i: int) -> None:
        async with child as lease:  # type: ignore[attr-defined]
            history = [{"role": "user", "content": f"Task {i}: find the failing test."}]
            for _ in range(6):
                reply = await governor.acomplete(lease, history, max_tokens=8)
                history.append({"role": "assistant", "content": reply.text})
                async with governor.tool_call(lease, "pytest") as call:
                    await asyncio.sleep(0.1)
                history.append({"role": "user", "content": call.reduce(log).text})

    async def swarm() -> None:
        async with governor.lease("planner") as plan:
            await governor.acomplete(plan, TASK, max_tokens=8)
            children = governor.fanout(plan, "worker", 8)
            await asyncio.gather(*(work(c, i) for i, c in enumerate(children)))

    try:
        asyncio.run(asyncio.wait_for(swarm(), timeout=90))
        _assert_released(backend)
    finally:
        backend.close()
