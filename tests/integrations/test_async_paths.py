"""Async agents never wait for a model or the engine on their event loop.

A governed agent's tool outputs are reduced by the governor's tool-output policy, here
a real ``LLMSummarizer`` whose model (``FakeBackend`` with ``latency_s`` per token)
takes about 0.25 s per summary, and every model call is planned against the ceiling
policy, here one that takes 0.3 s as a summarizing one does. Under ``ainvoke`` both run
while another coroutine on the same loop ticks every 5 ms: its longest gap stays far
below either wait. The chat model is the fake of ``langgraph_graphs`` (no model small
enough to run offline calls tools).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from governor import (
    AgentSpec,
    CompactionEvent,
    Governor,
    GovernorEvent,
    Policies,
    TokenCounter,
)
from governor.testing import FakeBackend
from integrations.langchain import GovernorMiddleware
from policies import DropOldest, LLMSummarizer
from tests.integrations.langgraph_graphs import ToolCallingModel, react_worker, search
from tests.loop_ticker import loop_ticker

WORKER = AgentSpec(name="worker", ceiling_tokens=4_000, tool_output_tokens=200)
SUMMARY = "search: 400 lines matched, every build step status ok."
WAIT_S = 0.25  # what the slowest blocking step here would hold the loop for, at least


class SlowCeiling:
    """``DropOldest`` that first takes 0.3 s, as a ceiling policy summarizing with a model."""

    def __init__(self, *, keep_last_turns: int = 2) -> None:
        self.inner = DropOldest(keep_last_turns=keep_last_turns)
        self.num_calls = 0

    def compact(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        ceiling_tokens: int,
        reserve_tokens: int,
        counter: TokenCounter,
    ) -> tuple[list[dict[str, Any]], CompactionEvent]:
        self.num_calls += 1
        time.sleep(0.3)
        return self.inner.compact(
            messages, ceiling_tokens=ceiling_tokens, reserve_tokens=reserve_tokens, counter=counter
        )


def governed() -> tuple[Governor, LLMSummarizer, SlowCeiling, list[GovernorEvent]]:
    model = FakeBackend(responder=lambda request: SUMMARY, latency_s=0.02)
    summarizer = LLMSummarizer(model, max_input_tokens=20_000)
    ceiling = SlowCeiling()
    policies = Policies(tool_output=summarizer, ceiling=ceiling)
    governor = Governor(FakeBackend(num_blocks=4_096), agents=[WORKER], policies=policies)
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    return governor, summarizer, ceiling, events


def longest_stall(work: Callable[[], Awaitable[Any]]) -> float:
    """Run ``work`` with a coroutine beside it on the loop; its longest gap between ticks."""

    async def main() -> float:
        async with loop_ticker() as gaps:
            await work()
        return max(gaps)

    return asyncio.run(main())


def test_the_middleware_summarizes_and_plans_off_the_event_loop() -> None:
    governor, summarizer, ceiling, events = governed()
    middleware = GovernorMiddleware(governor, agent="worker", on_ceiling="compact")
    agent = create_agent(ToolCallingModel(rounds=2), [search], middleware=[middleware])
    result: dict[str, Any] = {}

    async def work() -> None:
        result.update(await agent.ainvoke({"messages": [HumanMessage("build")]}))

    stalled = longest_stall(work)
    assert summarizer.stats().num_llm == 2  # each search result summarized by the model
    assert [m.content for m in result["messages"] if m.type == "tool"] == [SUMMARY] * 2
    assert ceiling.num_calls == 3  # each model call planned against the ceiling
    assert sum(e.kind == "released" for e in events) == 1
    assert stalled < WAIT_S / 2, stalled


def test_a_governed_graph_summarizes_off_the_event_loop() -> None:
    governor, summarizer, _, events = governed()
    graph = react_worker(governor, ToolCallingModel(rounds=2), agent=WORKER)
    result: dict[str, Any] = {}

    async def work() -> None:
        result.update(await graph.ainvoke({"messages": [HumanMessage("build")]}))

    stalled = longest_stall(work)
    assert summarizer.stats().num_llm == 2
    assert [m.content for m in result["messages"] if m.type == "tool"] == [SUMMARY] * 2
    assert sum(e.kind == "released" for e in events) == 1
    assert stalled < WAIT_S / 2, stalled


def test_a_governed_graph_settles_on_the_loop_when_no_policy_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tool results within ``tool_output_tokens`` and contexts within the ceiling: no
    policy runs, so no governed turn takes a thread hop to settle (the summarizing test
    above shows the hop where a policy does run)."""
    hops: list[str] = []
    to_thread = asyncio.to_thread

    async def counted(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__name__", repr(fn)))
        return await to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    governor, summarizer, ceiling, _ = governed()
    roomy = AgentSpec(name="worker", ceiling_tokens=20_000, tool_output_tokens=10_000)
    model = ToolCallingModel(rounds=2)
    graph = react_worker(governor, model, agent=roomy)
    result = asyncio.run(graph.ainvoke({"messages": [HumanMessage("build")]}))
    assert sum(m.type == "tool" for m in result["messages"]) == 2
    assert summarizer.stats().num_llm == 0 and ceiling.num_calls == 0
    assert len(model.contexts) == 3
    assert not [hop for hop in hops if hop in ("settle", "_at_ceiling")], hops


def test_a_governed_graph_compacts_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """One conversation over two invocations (a checkpointer keeps it), each searching
    once for about 6,000 tokens, against an 8,000-token ceiling: the second result
    overflows it, and the slow ceiling policy drops the first turn off the loop, in the
    one governed turn that takes a thread hop."""
    hops: list[str] = []
    to_thread = asyncio.to_thread

    async def counted(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__name__", repr(fn)))
        return await to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    ceiling = SlowCeiling(keep_last_turns=1)
    worker = AgentSpec(name="worker", ceiling_tokens=8_000)
    governor = Governor(
        FakeBackend(num_blocks=4_096), agents=[worker], policies=Policies(ceiling=ceiling)
    )
    model = ToolCallingModel(rounds=1)
    graph = react_worker(governor, model, checkpointer=InMemorySaver(), agent=worker)
    thread = {"configurable": {"thread_id": "conversation"}}
    result: dict[str, Any] = {}

    async def work() -> None:
        for question in ("build", "test"):
            result.update(await graph.ainvoke({"messages": [HumanMessage(question)]}, thread))

    stalled = longest_stall(work)
    assert ceiling.num_calls == 1
    assert [m.content for m in result["messages"] if m.type == "human"] == ["build", "test"]
    assert sum(m.type == "tool" for m in result["messages"]) == 1  # the first turn's dropped
    assert max(model.contexts) <= worker.ceiling_tokens
    assert [hop for hop in hops if hop in ("settle", "_at_ceiling")] == ["_at_ceiling"]
    assert stalled < WAIT_S / 2, stalled
