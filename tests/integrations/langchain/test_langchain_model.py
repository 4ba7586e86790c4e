"""``integrations.langchain.GovernedChatModel`` on real backends.

``LocalBackend`` runs the bundled engine's tiny-random model (real generation, a real
chat template and prefix cache); ``FakeBackend`` is used where exact, scripted output
matters (streams compared with calls, the request a call sent).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import operator
import time
from collections.abc import Iterator
from contextlib import aclosing
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage
from langchain_core.tools import tool

from backends import LocalBackend
from governor import AgentSpec, ConfigError, Governor, GovernorConfig, GovernorEvent, Policies
from governor.testing import FakeBackend
from integrations.langchain import GovernedChatModel, GovernorMiddleware
from policies import DropOldest

HOUSE = "You are a terse assistant. Answer in one short sentence and never apologise."
WRITER = AgentSpec(name="writer", ceiling_tokens=512, prefix="house")
CHATTER = AgentSpec(name="chatter", ceiling_tokens=300)


@pytest.fixture(scope="module")
def local() -> Iterator[LocalBackend]:
    with LocalBackend(config={"num_blocks": 128}) as backend:
        yield backend


@pytest.fixture
def governed(local: LocalBackend) -> Iterator[Governor]:
    governor = Governor(local, agents=[WRITER])
    governor.register_prefix("house", HOUSE)
    yield governor
    governor.unregister_prefix("house")
    assert governor.admission.counts()[:2] == (0, 0)
    metrics = local.metrics()
    assert metrics.num_blocks_in_use == metrics.num_blocks_pinned == 0


def fake(**options: Any) -> tuple[Governor, FakeBackend]:
    backend = FakeBackend(num_blocks=256, **options)
    policies = Policies(ceiling=DropOldest(keep_last_turns=1))
    return Governor(backend, agents=[CHATTER], policies=policies), backend


def no_leaks(governor: Governor, backend: FakeBackend) -> bool:
    return governor.admission.counts()[:2] == (0, 0) and backend.metrics().num_blocks_in_use == 0


# -- LocalBackend: real generation --------------------------------------------------------
def test_invoke_reports_the_backends_exact_usage(governed: Governor, local: LocalBackend) -> None:
    model = GovernedChatModel(governed, agent="writer", max_tokens=8)
    question = "Name three prime numbers."
    first = model.invoke([HumanMessage(question)])
    assert isinstance(first, AIMessage) and first.content
    prompt = local.count_messages(
        [{"role": "system", "content": HOUSE}, {"role": "user", "content": question}]
    )  # the agent's shared prefix comes first
    usage = first.usage_metadata
    assert usage is not None
    assert usage["input_tokens"] == prompt
    finish = first.response_metadata["finish_reason"]
    assert finish in {"stop", "length"}
    assert usage["output_tokens"] == 8 if finish == "length" else usage["output_tokens"] < 8
    assert usage["total_tokens"] == prompt + usage["output_tokens"]
    assert first.response_metadata["model_name"] == local.model
    second = model.invoke([HumanMessage(question)])
    assert second.usage_metadata is not None
    cached = second.usage_metadata.get("input_token_details", {}).get("cache_read", 0)
    assert cached >= local.capacity().block_size  # the pinned prefix at least


def test_stream_and_astream_yield_the_tokens_then_the_usage(governed: Governor) -> None:
    model = GovernedChatModel(governed, agent="writer", max_tokens=6)
    messages = [HumanMessage("Count to five.")]
    for chunks in (list(model.stream(messages)), asyncio.run(_collect(model, messages))):
        assert len(chunks) >= 2 and all(isinstance(c, AIMessageChunk) for c in chunks)
        *pieces, last = chunks
        assert all(c.usage_metadata is None for c in pieces) and last.content == ""
        assert last.chunk_position == "last"
        whole = functools.reduce(operator.add, chunks)
        assert whole.content == "".join(str(c.content) for c in pieces)
        assert whole.usage_metadata == last.usage_metadata
        assert whole.usage_metadata is not None
        assert 1 <= whole.usage_metadata["output_tokens"] <= 6


async def _collect(model: GovernedChatModel, messages: list[Any]) -> list[Any]:
    return [chunk async for chunk in model.astream(messages)]


def test_under_the_middleware_the_model_calls_in_the_runs_lease(governed: Governor) -> None:
    """One lease per agent run; the governor records the call once."""
    events: list[GovernorEvent] = []
    governed.subscribe(events.append)

    @tool
    def search(query: str) -> str:
        """Search the notes."""
        return query

    model = GovernedChatModel(governed, agent="writer", max_tokens=8)
    middleware = GovernorMiddleware(governed, agent="writer", max_tokens=8)
    agent = create_agent(model=model, tools=[search], middleware=[middleware])
    result = asyncio.run(agent.ainvoke({"messages": [HumanMessage("Hello")]}))
    reply = result["messages"][-1]
    assert isinstance(reply, AIMessage) and reply.usage_metadata is not None
    assert [e.kind for e in events].count("requested") == 1
    (released,) = [e for e in events if e.kind == "released"]
    assert released.attributes["num_calls"] == 1 == result["kvgov_model_calls"]
    assert result["kvgov_input_tokens"] == reply.usage_metadata["input_tokens"]
    assert result["kvgov_peak_tokens"] == reply.usage_metadata["input_tokens"]


# -- FakeBackend: exact output ------------------------------------------------------------
def test_stream_matches_invoke_and_sends_the_options() -> None:
    governor, backend = fake()
    model = GovernedChatModel(governor, agent="chatter", max_tokens=4, stop=["END"])
    said = model.invoke("hi")
    streamed = list(model.stream("hi"))
    assert "".join(str(c.content) for c in streamed) == said.content == " hello" * 4
    request = backend.calls[-1]
    assert request.max_tokens == 4 and request.stop == ("END",)
    assert request.messages == [{"role": "user", "content": "hi"}]
    GovernedChatModel(governor, agent="chatter", tenant="acme", max_tokens=1).invoke("hi")
    assert backend.calls[-1].cache_salt == "acme"
    bound = model.bind(max_tokens=2, temperature=0.5)
    assert bound.invoke("hi").content == " hello" * 2
    assert backend.calls[-1].temperature == 0.5
    with pytest.raises(TypeError, match="logprobs"):
        model.invoke("hi", logprobs=True)
    assert no_leaks(governor, backend)


def test_a_call_compacts_by_the_ceiling_policy() -> None:
    governor, backend = fake()
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    history: list[Any] = [SystemMessage("Be brief.")]
    for n in range(12):
        history += [HumanMessage(f"question {n}: " + "why " * 20), AIMessage("because " * 20)]
    history.append(HumanMessage("and now?"))
    reply = GovernedChatModel(governor, agent="chatter", max_tokens=16).invoke(history)
    assert [e.kind for e in events].count("compacted") == 1
    sent = backend.calls[-1].messages
    assert sent is not None and sent[0]["content"] == "Be brief." and len(sent) < len(history)
    assert reply.usage_metadata is not None
    assert reply.usage_metadata["input_tokens"] + 16 <= CHATTER.ceiling_tokens
    assert no_leaks(governor, backend)


def test_a_given_lease_is_used_until_it_is_released() -> None:
    governor, backend = fake()
    with governor.lease("chatter") as lease:
        model = GovernedChatModel(governor, lease=lease, max_tokens=3)
        model.invoke("one")
        asyncio.run(model.ainvoke("two"))
        assert lease.num_calls == 2
        by_function = GovernedChatModel(governor, lease=lambda: lease, max_tokens=3)
        by_function.invoke("three")
        assert lease.num_calls == 3
    with pytest.raises(ConfigError, match="released"):
        model.invoke("four")
    assert no_leaks(governor, backend)


def test_a_model_without_a_lease_or_an_agent_is_refused() -> None:
    governor, _ = fake()
    with pytest.raises(ConfigError, match="agent="):
        GovernedChatModel(governor).invoke("hi")
    with pytest.raises(ConfigError, match="writer"):
        GovernedChatModel(governor, agent="writer")
    with pytest.raises(ConfigError, match="lease"):
        GovernedChatModel(governor, lease=42)


def test_a_sync_stream_works_under_a_running_loop_and_stops_early() -> None:
    governor, backend = fake(latency_s=0.001)
    model = GovernedChatModel(governor, agent="chatter", max_tokens=50)

    async def inside_a_loop() -> str:
        return "".join(str(chunk.content) for chunk in model.stream("hi"))

    assert asyncio.run(inside_a_loop()) == " hello" * 50
    stream = model.stream("hi")
    assert next(stream).content == " hello"
    stream.close()  # the call is abandoned: its lease and blocks come back
    assert no_leaks(governor, backend)


def test_an_async_stream_stopped_early_returns_its_lease_and_blocks_at_once() -> None:
    governor, backend = fake(latency_s=0.001)
    model = GovernedChatModel(governor, agent="chatter", max_tokens=50)

    async def first_chunk_only() -> str:
        async with aclosing(model.astream("hi")) as stream:
            first = await anext(stream)
            assert backend.metrics().num_blocks_in_use > 0  # mid-call
        # Closed: the call is aborted and the lease released now, not when the garbage
        # collector finalizes the generators (which released the lease with the call
        # still in flight, and failed).
        assert no_leaks(governor, backend)
        return str(first.content)

    assert asyncio.run(first_chunk_only()) == " hello"


def test_an_agent_run_whose_stream_is_abandoned_is_parked_then_released_on_close() -> None:
    backend = FakeBackend(num_blocks=256, latency_s=0.002)
    governor = Governor(backend, agents=[CHATTER], config=GovernorConfig(park_after_s=0.05))
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    model = GovernedChatModel(governor=governor, agent="chatter", max_tokens=40)
    middleware = GovernorMiddleware(governor, agent="chatter", max_tokens=40)
    agent = create_agent(model, [], middleware=[middleware])

    stream = agent.stream({"messages": [HumanMessage("hi")]}, stream_mode="messages")
    next(stream), next(stream)
    # The caller stops reading mid-reply: the run waits where it stands, its lease idle,
    # so it is parked in time and holds no admission room.
    assert wait_until(lambda: governor.admission.counts()[0] == 0)
    assert [e.attributes["reason"] for e in events if e.kind == "parked"] == ["turn"]
    assert backend.metrics().num_blocks_in_use == 0
    gc.collect()
    gc.disable()  # closing the stream, not the collector, returns the lease
    try:
        stream.close()
        assert no_leaks(governor, backend)
        released = [e for e in events if e.kind == "released"]
        assert [e.attributes["error"] for e in released] == [None]  # not the agent's failure
    finally:
        gc.enable()


def wait_until(condition: Any, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_an_agent_streams_its_reply_from_the_runs_lease() -> None:
    governor, backend = fake()
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    model = GovernedChatModel(governor=governor, agent="chatter", max_tokens=5)
    middleware = GovernorMiddleware(governor, agent="chatter", max_tokens=5)
    agent = create_agent(model, [], middleware=[middleware])
    inputs = {"messages": [HumanMessage("hi")]}
    chunks = [message for message, _ in agent.stream(inputs, stream_mode="messages")]
    assert "".join(str(chunk.content) for chunk in chunks) == " hello" * 5
    assert [e.kind for e in events].count("requested") == 1
    assert no_leaks(governor, backend)
