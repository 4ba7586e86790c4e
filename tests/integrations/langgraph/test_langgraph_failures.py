"""A governed LangGraph run that does not end well returns every lease and fan-out slot:
a node that raises, a cancelled ``ainvoke``, a consumer that stops streaming early, a
node that interrupts for a human (and is resumed), the recursion limit; and its trace
(the real OpenTelemetry SDK, in memory) says which agents failed and how. Real LangGraph
runtime; the chat model is ``ToolCallingModel`` (``langgraph_graphs.py``), the governor
runs on ``FakeBackend``.
"""

from __future__ import annotations

import asyncio
import operator
from collections import Counter
from collections.abc import Sequence
from contextlib import aclosing
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, RetryPolicy, Send, interrupt
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from typing_extensions import TypedDict

from governor import AgentSpec, Governor
from integrations.langgraph import govern
from integrations.otel import instrument
from tests.integrations.langgraph_graphs import (
    NUM_WORKERS,
    PLANNER,
    WORKER,
    Recorder,
    ToolCallingModel,
    assert_no_leaks,
    make_governor,
    planner_graph,
    react_worker,
)

INPUTS = {"rounds": 0, "reports": []}


class FailingModel(ToolCallingModel):
    """Fails its call after the first tool result, in every worker."""

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        if any(isinstance(m, ToolMessage) for m in messages):
            raise RuntimeError("the model server went away")
        return super()._reply(messages)


def swarm(governor: Governor, model: ToolCallingModel) -> Any:
    return planner_graph(governor, react_worker(governor, model, agent=WORKER))


def outermost_run_error(recorder: Recorder) -> object:
    finished = [e for e in recorder.events if e.kind == "run.finished"]
    return finished[-1].attributes["error"]


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_node_that_raises_fails_the_run_and_returns_every_lease(mode: str) -> None:
    governor = make_governor()
    recorder = Recorder(governor)
    graph = swarm(governor, FailingModel())

    with pytest.raises(RuntimeError, match="the model server went away"):
        if mode == "invoke":
            graph.invoke(INPUTS)
        else:
            asyncio.run(graph.ainvoke(INPUTS))

    assert_no_leaks(governor)
    assert outermost_run_error(recorder) == "RuntimeError"
    assert recorder.kinds("worker").count("admitted") == recorder.kinds("worker").count("released")
    # The released events say which agents failed: the worker whose call raised, the
    # others LangGraph cancelled with the run; the planner, parked, did not fail.
    released = {e.lease_id: e for e in recorder.events if e.kind == "released"}.values()
    worker_errors = [e.attributes["error"] for e in released if e.agent == "worker"]
    assert "RuntimeError" in worker_errors
    assert set(worker_errors) <= {"RuntimeError", "cancelled"}
    assert [e.attributes["error"] for e in released if e.agent == "planner"] == [None]


def one_agent(governor: Governor, node: Any, **options: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", node, **options)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return govern(builder, governor, {"agent": AgentSpec(name="solo", ceiling_tokens=1_000)})


def test_a_failed_turn_is_the_failure_its_lease_is_released_with_unless_a_retry_ends_well() -> None:
    attempts: list[int] = []

    def flaky(state: MessagesState) -> dict[str, Any]:
        attempts.append(len(attempts))
        if len(attempts) == 1:
            raise ConnectionError("the model server blinked")
        return {"messages": [AIMessage("done")]}

    def broken(state: MessagesState) -> dict[str, Any]:
        raise ConnectionError("the model server is down")

    retried, failed = make_governor(), make_governor()
    retried_events, failed_events = Recorder(retried, "solo"), Recorder(failed, "solo")
    retry = RetryPolicy(max_attempts=2, initial_interval=0.001, jitter=False)
    inputs = {"messages": [HumanMessage("go")]}

    assert one_agent(retried, flaky, retry_policy=retry).invoke(inputs)["messages"][-1].content == (
        "done"
    )
    with pytest.raises(ConnectionError):
        one_agent(failed, broken).invoke(inputs)

    assert len(attempts) == 2
    outcomes = ((retried, retried_events, None), (failed, failed_events, "ConnectionError"))
    for governor, recorder, error in outcomes:
        assert_no_leaks(governor)
        (released,) = [e for e in recorder.events if e.kind == "released"]
        assert released.attributes["error"] == error


def test_a_cancelled_run_returns_every_lease_and_slot() -> None:
    governor = make_governor()
    model = ToolCallingModel(latency_s=0.5)
    graph = swarm(governor, model)

    async def cancel_then_run() -> dict[str, Any]:
        task = asyncio.ensure_future(graph.ainvoke(INPUTS))
        await asyncio.sleep(0.2)  # max_fanout workers in their model call, the rest queued
        assert governor.admission.counts()[0] == PLANNER.max_fanout  # the planner parked
        assert governor.fanout_limiter.num_parents == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert_no_leaks(governor)  # at once, not when the loop closes
        model.latency_s = 0.001
        return await graph.ainvoke(INPUTS)  # the governor serves the next run as before

    assert len(asyncio.run(cancel_then_run())["reports"]) == NUM_WORKERS
    assert_no_leaks(governor)


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_a_consumer_that_stops_streaming_early_returns_every_lease(mode: str) -> None:
    governor = make_governor()
    graph = swarm(governor, ToolCallingModel(latency_s=0.05))
    options: dict[str, Any] = {"stream_mode": "updates", "subgraphs": True}

    if mode == "stream":
        chunks = graph.stream(INPUTS, **options)
        next(chunks), next(chunks), next(chunks)
        assert governor.admission.counts()[0] > 0  # workers hold leases mid-stream
        chunks.close()
        assert_no_leaks(governor)
        return

    async def stop_early() -> None:
        async with aclosing(graph.astream(INPUTS, **options)) as chunks:
            seen = 0
            async for _ in chunks:
                seen += 1
                if seen == 3:
                    assert governor.admission.counts()[0] > 0
                    break
        # Closed: LangGraph's own stream is closed with it and its tasks cancelled, so
        # nothing is held until the garbage collector or the loop's shutdown gets to it.
        assert_no_leaks(governor)

    asyncio.run(stop_early())


class Reviews(TypedDict):
    messages: Annotated[list[BaseMessage], operator.add]


def reviewers(governor: Governor) -> Any:
    """A planner sends two drafts to reviewers, each of whom waits for a human."""

    def review(state: Reviews) -> dict[str, Any]:
        verdict = interrupt(f"approve {state['messages'][0].content}?")
        return {"messages": [AIMessage(f"{state['messages'][0].content}: {verdict}")]}

    def send(state: Reviews) -> list[Send]:
        return [Send("review", {"messages": [HumanMessage(f"draft {i}")]}) for i in range(2)]

    builder = StateGraph(Reviews)
    builder.add_node("plan", lambda state: {})
    builder.add_node("review", review)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", send)
    builder.add_edge("review", END)
    agents = {
        "plan": AgentSpec(name="planner", ceiling_tokens=1_000, max_fanout=2),
        "review": AgentSpec(name="reviewer", ceiling_tokens=1_000),
    }
    return govern(builder.compile(checkpointer=InMemorySaver()), governor, agents)


def test_an_interrupted_node_holds_no_lease_while_a_human_decides() -> None:
    governor = make_governor()
    recorder = Recorder(governor, agent="reviewer")
    graph = reviewers(governor)
    config: dict[str, Any] = {"configurable": {"thread_id": "review-1"}}

    paused = graph.invoke({"messages": []}, config)

    assert len(paused["__interrupt__"]) == 2
    assert_no_leaks(governor)  # nobody holds memory while the human thinks
    # An interrupt is LangGraph's control flow, not a failure of the run or the agents.
    assert outermost_run_error(recorder) is None
    assert [e.attributes["error"] for e in recorder.events if e.kind == "released"] == [None] * 3
    answers = {pending.id: "approved" for pending in paused["__interrupt__"]}
    done = graph.invoke(Command(resume=answers), config)

    assert sorted(str(m.content) for m in done["messages"]) == [
        "draft 0: approved",
        "draft 1: approved",
    ]
    assert_no_leaks(governor)
    assert recorder.kinds("reviewer").count("admitted") == 4  # twice each: asked, resumed


def test_the_recursion_limit_returns_every_lease() -> None:
    governor = make_governor()

    def again(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("once more")]}

    builder = StateGraph(MessagesState)
    builder.add_node("loop", again)
    builder.add_edge(START, "loop")
    builder.add_edge("loop", "loop")
    graph = govern(builder, governor, {"loop": AgentSpec(name="looper", ceiling_tokens=4_000)})

    with pytest.raises(GraphRecursionError):
        graph.invoke({"messages": [HumanMessage("go")]}, {"recursion_limit": 10})
    assert_no_leaks(governor)


def test_the_trace_says_which_agents_failed_and_leaves_no_span_open() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    governor = make_governor()
    handle = instrument(governor, tracer_provider=provider)
    model = ToolCallingModel(latency_s=0.5)
    graph = swarm(governor, model)

    async def cancel_mid_run() -> None:
        task = asyncio.ensure_future(graph.ainvoke(INPUTS))
        await asyncio.sleep(0.2)  # 3 workers in their model call, 7 queued for a slot
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_mid_run())
    cancelled = _outcomes(spans.get_finished_spans())
    spans.clear()
    with pytest.raises(RuntimeError):
        asyncio.run(swarm(governor, FailingModel()).ainvoke(INPUTS))
    failed = _outcomes(spans.get_finished_spans())
    handle.uninstrument()

    # Cancelled: the workers in a model call, cancelled; those queued for a fan-out slot,
    # never admitted; the planner, parked meanwhile, did not fail; the runs, cancelled.
    assert cancelled["invoke_agent worker"] == Counter(
        {"cancelled": PLANNER.max_fanout, "never admitted": NUM_WORKERS - PLANNER.max_fanout}
    )
    assert cancelled["invoke_agent planner"] == Counter({None: 1})
    assert set(cancelled["invoke_workflow LangGraph"]) == {"cancelled"}
    # Raised: a worker's model call failed; LangGraph cancelled its siblings.
    assert failed["invoke_agent worker"]["RuntimeError"] >= 1
    assert set(failed["invoke_agent worker"]) <= {"RuntimeError", "cancelled", "never admitted"}
    assert "RuntimeError" in failed["invoke_workflow LangGraph"]
    assert_no_leaks(governor)


def _outcomes(finished: Sequence[ReadableSpan]) -> dict[str, Counter[str | None]]:
    """span name -> how many of them ended with each ``error.type`` (None: no error)."""
    outcomes: dict[str, Counter[str | None]] = {}
    for span in finished:
        error = (span.attributes or {}).get("error.type")
        assert (span.status.status_code is StatusCode.ERROR) == (error is not None), span.name
        outcomes.setdefault(span.name, Counter())[error] += 1  # type: ignore[index]
    return outcomes
