"""Every KV block comes back when a governed run ends badly, on the bundled engine, in
process and behind a kvgov serve process.

``GovernedChatModel`` generates on a real ``LocalBackend`` (tiny-random) inside a
``govern``-ed graph and under ``GovernorMiddleware``, so the engine really holds the
call's blocks: each run is stopped mid-generation, at its third token, by an error
raised there, by cancelling its task, or by closing its stream. At that instant the
engine holds one running request and the blocks of its prompt and tokens so far; once
the run has raised, been cancelled or closed, it holds none, and the governor holds no
lease.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from backends import LocalBackend
from backends.remote.backend import RemoteBackend
from governor import AgentSpec, BackendMetrics, Governor, GovernorEvent
from integrations.langchain import GovernedChatModel, GovernorMiddleware
from integrations.langgraph import govern
from tests.integrations.langgraph_graphs import sync_and_async

Served = LocalBackend | RemoteBackend
WRITER = AgentSpec(name="writer", ceiling_tokens=512)
TASK = "Write a long story about a lighthouse keeper and the sea."
STOP_AT = 3  # tokens into the reply


class Stopped(Exception):
    """Raised from inside the generation, at its ``STOP_AT``-th token."""


@pytest.fixture(scope="module", params=["local", "remote"])
def backend(request: pytest.FixtureRequest) -> Iterator[Served]:
    """The engine in process, or behind a kvgov serve process with the same pool, where
    the server aborts a call when its client goes away."""
    if request.param == "remote":
        server = request.getfixturevalue("kvgov_server")
        assert server.config == {"num_blocks": 64, "block_size": 16}
        with RemoteBackend(server.base_url) as remote:
            yield remote
        return
    with LocalBackend(config={"num_blocks": 64}) as local:
        yield local


def governed(backend: Served, how: str) -> tuple[Governor, Any, list[GovernorEvent]]:
    """A governor on ``backend``, and an agent of ``how`` ("graph" or "middleware") whose
    model generates up to 64 tokens in the writer's lease."""
    governor = Governor(backend, agents=[WRITER])
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    model = GovernedChatModel(governor, agent="writer", max_tokens=64)
    if how == "middleware":
        middleware = GovernorMiddleware(governor, agent="writer", max_tokens=64)
        return governor, create_agent(model, [], middleware=[middleware]), events

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", sync_and_async(agent, aagent))
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return governor, govern(builder.compile(), governor, {"agent": WRITER}), events


def assert_held_mid_call(backend: Served, seen: BackendMetrics) -> None:
    """One request was generating, holding its prompt's blocks and then some."""
    prompt = backend.count_messages([{"role": "user", "content": TASK}])
    block_size = backend.capacity().block_size
    assert (seen.num_requests_running, seen.num_requests_waiting) == (1, 0)
    assert seen.num_tokens_in_use >= prompt + STOP_AT - 1
    assert seen.num_blocks_in_use == math.ceil(seen.num_tokens_in_use / block_size)


def assert_all_returned(governor: Governor, backend: Served, events: list[GovernorEvent]) -> None:
    m = backend.metrics()
    if isinstance(backend, RemoteBackend):  # the server learns of the abort a moment later
        deadline = time.monotonic() + 5
        while m.num_blocks_in_use or m.num_requests_running:
            assert time.monotonic() < deadline, m
            time.sleep(0.01)
            m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_requests_running, m.num_requests_waiting) == (0, 0, 0)
    assert governor.admission.counts()[:2] == (0, 0)
    requested = {e.lease_id for e in events if e.kind == "requested"}
    assert len(requested) == 1
    assert {e.lease_id for e in events if e.kind == "released"} == requested


INPUTS = {"messages": [HumanMessage(TASK)]}


@pytest.mark.parametrize("how", ["graph", "middleware"])
def test_an_error_mid_generation_returns_every_block(backend: Served, how: str) -> None:
    governor, agent, events = governed(backend, how)
    seen: list[BackendMetrics] = []

    class RaiseAtToken(BaseCallbackHandler):
        raise_error = True

        def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            if len(seen) < STOP_AT:
                seen.append(backend.metrics())
                if len(seen) == STOP_AT:
                    raise Stopped("stopped mid-generation")

    with pytest.raises(Stopped):
        for _ in agent.stream(INPUTS, {"callbacks": [RaiseAtToken()]}, stream_mode="messages"):
            pass
    assert_held_mid_call(backend, seen[-1])
    assert_all_returned(governor, backend, events)
    released = [e.attributes["error"] for e in events if e.kind == "released"]
    assert released == ["Stopped"]


@pytest.mark.parametrize("how", ["graph", "middleware"])
def test_a_cancelled_run_returns_every_block(backend: Served, how: str) -> None:
    governor, agent, events = governed(backend, how)
    seen: list[BackendMetrics] = []

    async def main() -> None:
        mid_call = asyncio.Event()

        async def consume() -> None:
            chunks = 0
            async for _ in agent.astream(INPUTS, stream_mode="messages"):
                chunks += 1
                if chunks == STOP_AT:
                    seen.append(await asyncio.to_thread(backend.metrics))
                    mid_call.set()

        task = asyncio.create_task(consume())
        await mid_call.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert_held_mid_call(backend, seen[0])
    assert_all_returned(governor, backend, events)
    assert [e.attributes["error"] for e in events if e.kind == "released"] == ["cancelled"]


@pytest.mark.parametrize("how", ["graph", "middleware"])
def test_a_stream_closed_mid_reply_returns_every_block(backend: Served, how: str) -> None:
    governor, agent, events = governed(backend, how)
    stream = agent.stream(INPUTS, stream_mode="messages")
    for _ in range(STOP_AT):
        next(stream)
    seen = backend.metrics()
    stream.close()
    assert_held_mid_call(backend, seen)
    assert_all_returned(governor, backend, events)
