"""The governor's event stream: one ordered record of a lease's life, calls and tools."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest

from governor import AgentSpec, ConfigError, Governor, GovernorConfig, GovernorEvent
from governor.testing import FakeBackend

AGENT = AgentSpec(name="coder", ceiling_tokens=400)
TASK = [{"role": "user", "content": "Fix the login test."}]


def _governor(**config: object) -> tuple[Governor, list[GovernorEvent]]:
    governor = Governor(
        FakeBackend(),
        config=GovernorConfig(**config),
        agents=[AGENT],  # type: ignore[arg-type]
    )
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    return governor, events


def test_a_lease_with_two_calls_and_a_tool_in_order() -> None:
    governor, events = _governor(park_after_s=0)
    with governor.lease("coder", tenant="acme") as lease:
        governor.complete(lease, TASK, max_tokens=5)
        with governor.tool_call(lease, "pytest"):
            pass
        governor.complete(lease, TASK, max_tokens=5)
    assert [e.kind for e in events] == [
        "requested",
        "admitted",
        "call.started",
        "call.finished",
        "tool.started",
        "retained",  # its KV is held while the tool runs
        "parked",
        "tool.finished",
        "resumed",
        "call.started",
        "call.finished",
        "released",
    ]
    assert {(e.lease_id, e.agent, e.tenant) for e in events} == {(lease.lease_id, "coder", "acme")}
    requested = events[0].attributes
    assert requested == {"ceiling_tokens": 400, "priority": 0, "parent_id": None,
                         "prefix_blocks": 0}  # fmt: skip
    finished = events[3].attributes
    assert finished["completion_tokens"] == 5 and finished["finish_reason"] == "length"
    assert finished["tokens_in_context"] == finished["prompt_tokens"] + 5
    assert events[7].attributes["tool"] == "pytest" and events[7].attributes["error"] is None
    assert events[-1].attributes == {
        "tokens_in_context": lease.tokens_in_context,
        "num_calls": 2,
        "error": None,
    }


def test_children_name_their_parent() -> None:
    governor, events = _governor()
    with governor.lease("coder") as parent, governor.child(parent, "coder"):
        pass
    child_requested = [e for e in events if e.kind == "requested"][1]
    assert child_requested.attributes["parent_id"] == parent.lease_id
    parked = next(e for e in events if e.kind == "parked")
    assert (parked.lease_id, parked.attributes["reason"]) == (parent.lease_id, "children")


def test_failed_calls_and_tools_are_recorded() -> None:
    governor, events = _governor()

    async def main() -> None:
        async with governor.lease("coder") as lease:
            stream = governor.astream(lease, TASK, max_tokens=20)
            async with aclosing(stream) as chunks:
                await anext(chunks)  # the consumer walks away after one chunk
            with pytest.raises(KeyError):
                async with governor.tool_call(lease, "lookup"):
                    raise KeyError("missing")

    asyncio.run(main())
    failed = next(e for e in events if e.kind == "call.failed")
    assert failed.attributes["error"] == "cancelled"
    tool = next(e for e in events if e.kind == "tool.finished")
    assert tool.attributes["error"] == "KeyError"


def test_leases_in_a_run_carry_its_id_across_threads_and_tasks() -> None:
    governor, events = _governor()

    def worker() -> None:
        with governor.lease("coder"):
            pass

    async def main() -> None:
        async with governor.run("triage") as run:
            await asyncio.to_thread(worker)  # a copy of the context: same run
            async with governor.lease("coder"):
                pass
            with governor.run("inner") as inner:
                worker()
        assert (run.name, inner.parent_id) == ("triage", run.run_id)

    asyncio.run(main())
    with governor.lease("coder"):
        pass  # outside any run
    started = [e for e in events if e.kind == "run.started"]
    outer, inner = (e.run_id for e in started)
    requested = [e.run_id for e in events if e.kind == "requested"]
    assert requested == [outer, outer, inner, None]
    assert started[1].attributes == {"name": "inner", "parent_run_id": outer}
    finished = [e for e in events if e.kind == "run.finished"]
    assert [e.attributes["name"] for e in finished] == ["inner", "triage"]
    assert all(e.lease_id is None for e in started + finished)
    with pytest.raises(ConfigError, match="name"):
        governor.run("")


def test_a_call_made_outside_the_governor_is_recorded() -> None:
    governor, events = _governor()
    with governor.lease("coder") as lease:
        governor.record_call(lease, prompt_tokens=120, completion_tokens=30, elapsed_s=0.5)
        assert (lease.tokens_in_context, lease.num_calls) == (150, 1)
        with pytest.raises(ConfigError, match="prompt_tokens"):
            governor.record_call(lease, prompt_tokens=-1, completion_tokens=0)
    finished = next(e for e in events if e.kind == "call.finished")
    assert finished.attributes["tokens_in_context"] == 150
    assert finished.attributes["elapsed_s"] >= 0.5
    messages, salt = governor.with_prefix(lease, TASK)
    assert list(messages) == TASK and salt is None  # no registered prefix


def test_released_says_what_ended_the_leases_work() -> None:
    governor, events = _governor()

    async def main() -> None:
        async with governor.lease(AGENT.name):
            pass
        with pytest.raises(ValueError):
            async with governor.lease(AGENT.name):
                raise ValueError("the agent's work failed")
        waiting = asyncio.ensure_future(_hold(governor))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())
    released = [e.attributes["error"] for e in events if e.kind == "released"]
    assert released == [None, "ValueError", "cancelled"]


async def _hold(governor: Governor) -> None:
    async with governor.lease(AGENT.name):
        await asyncio.sleep(10)
