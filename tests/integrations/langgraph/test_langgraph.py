"""``integrations.langgraph.govern`` with the real LangGraph and LangChain runtimes.

The graphs, the fake chat model (``ToolCallingModel``: no model small enough to run
offline calls tools) and the leak check are in ``langgraph_graphs.py``. The governor runs
on ``FakeBackend``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from governor import (
    AgentSpec,
    CeilingExceeded,
    ConfigError,
    Governor,
    GovernorConfig,
    Policies,
    TopologyError,
)
from governor.testing import FakeBackend
from integrations.langchain import GovernedChatModel, GovernorMiddleware
from integrations.langgraph import GovernedGraph, current_lease, govern
from policies import DropOldest
from tests.integrations.langgraph_graphs import (
    NUM_WORKERS,
    PLANNER,
    WORKER,
    Outer,
    Recorder,
    ToolCallingModel,
    WorkerState,
    assert_no_leaks,
    make_governor,
    planner_graph,
    react_worker,
    run,
    search,
    sync_and_async,
)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke", "stream", "astream"])
def test_planner_and_react_workers_stay_within_their_leases(mode: str) -> None:
    governor = make_governor()
    recorder = Recorder(governor)
    model = ToolCallingModel()
    worker = react_worker(governor, model, agent=WORKER)
    graph = planner_graph(governor, worker)

    result = run(graph, {"rounds": 0, "reports": []}, mode)

    reports = result["reports"]
    assert len(reports) == NUM_WORKERS
    assert all(str(messages[-1].content) == "answer after 2 searches" for messages in reports)
    # At most max_fanout workers held a lease at once, and they did overlap.
    assert 1 < recorder.peak <= PLANNER.max_fanout
    # Every tool result in the state was reduced to the worker's budget, exactly counted.
    results = [m for messages in reports for m in messages if isinstance(m, ToolMessage)]
    assert len(results) == 2 * NUM_WORKERS
    assert len(search.invoke({"query": "task 0 #0"})) > 19_000
    assert max(governor.counter.count(str(m.content)) for m in results) <= WORKER.tool_output_tokens
    # No worker's context (what its model was sent) passed the ceiling.
    assert len(model.contexts) == 3 * NUM_WORKERS
    assert max(model.contexts) <= WORKER.ceiling_tokens
    released = [e for e in recorder.events if e.kind == "released" and e.agent == "worker"]
    assert len(released) == NUM_WORKERS
    assert all(0 < e.attributes["tokens_in_context"] <= WORKER.ceiling_tokens for e in released)
    assert all(e.attributes["num_calls"] == 3 for e in released)
    # The planner was parked while its workers ran and resumed for its second superstep.
    # (parked from the end of each of its turns: an agent between turns holds nothing up).
    kinds = recorder.kinds("planner")
    assert kinds == ["requested", "admitted", "parked", "resumed", "parked", "released"]
    planner_id = next(e.lease_id for e in recorder.events if e.agent == "planner")
    first_worker = next(i for i, e in enumerate(recorder.events) if e.agent == "worker")
    resumed = next(i for i, e in enumerate(recorder.events) if e.kind == "resumed")
    assert all(
        e.kind == "requested"
        for e in recorder.events[first_worker:resumed]
        if e.lease_id == planner_id
    )
    requests = [e for e in recorder.events if e.kind == "requested" and e.agent == "worker"]
    assert {e.attributes["parent_id"] for e in requests} == {planner_id}
    # One run around it all; every lease carries its id.
    top = next(e for e in recorder.events if e.kind == "run.started")
    assert all(e.run_id == top.run_id for e in requests)
    assert_no_leaks(governor)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_nested_subgraph_shares_the_planner_fanout_cap(mode: str) -> None:
    """The planner sends two teams; each team's graph sends five workers. LangGraph would
    run all ten at once (its max_concurrency is per graph); the planner's cap holds."""
    governor = make_governor()
    recorder = Recorder(governor)
    model = ToolCallingModel(rounds=1)
    worker = react_worker(governor, model, agent=WORKER)

    def lead(state: WorkerState) -> list[Send]:
        return [Send("worker", {"messages": [HumanMessage(f"{i}")]}) for i in range(5)]

    team = StateGraph(WorkerState)
    team.add_node("worker", worker)
    team.add_conditional_edges(START, lead)
    team.add_edge("worker", END)
    governed_team = govern(team, governor, {"worker": WORKER})

    def planner(state: Outer) -> dict[str, Any]:
        return {"rounds": state["rounds"] + 1}

    def fan_out(state: Outer) -> list[Send]:
        return [Send("team", {"messages": []}) for _ in range(2)]

    builder = StateGraph(Outer)
    builder.add_node("planner", planner)
    builder.add_node("team", governed_team)
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", fan_out)
    builder.add_edge("team", END)
    graph = govern(builder, governor, {"planner": PLANNER})

    result = run(graph, {"rounds": 0, "reports": []}, mode)

    assert len(result["reports"]) == 10
    assert 1 < recorder.peak <= PLANNER.max_fanout
    planner_id = next(e.lease_id for e in recorder.events if e.agent == "planner")
    requests = [e for e in recorder.events if e.kind == "requested" and e.agent == "worker"]
    assert len(requests) == 10
    assert {e.attributes["parent_id"] for e in requests} == {planner_id}
    assert_no_leaks(governor)


def test_tool_output_over_the_ceiling_raises_at_the_ceiling() -> None:
    """Without a tool-output budget a 20,000-character result passes the worker's
    ceiling: the default ceiling policy refuses it, and nothing is left held."""
    governor = make_governor()
    unbounded = AgentSpec(name="worker", ceiling_tokens=2_000)
    worker = react_worker(governor, ToolCallingModel(), agent=unbounded)
    builder = StateGraph(Outer)
    builder.add_node("planner", lambda state: {"rounds": 2})
    builder.add_node("worker", worker)
    builder.add_edge(START, "planner")
    builder.add_conditional_edges(
        "planner", lambda state: [Send("worker", {"messages": [HumanMessage("task")]})]
    )
    builder.add_edge("worker", END)
    graph = govern(builder, governor, {"planner": PLANNER, "worker": unbounded})

    with pytest.raises(CeilingExceeded) as caught:
        graph.invoke({"rounds": 0, "reports": []})

    assert caught.value.agent == "worker"
    assert caught.value.ceiling == 2_000
    assert_no_leaks(governor)


def test_a_compacting_policy_rewrites_the_state() -> None:
    """A flat ReAct agent, one conversation over several invocations (a checkpointer
    keeps it): its tools node runs in the agent's lease, and at the ceiling
    ``DropOldest`` drops the oldest turns from the state instead of refusing."""
    governor = Governor(
        FakeBackend(num_blocks=4_096), policies=Policies(ceiling=DropOldest(keep_last_turns=1))
    )
    recorder = Recorder(governor, agent="agent")
    spec = AgentSpec(name="agent", ceiling_tokens=1_000, tool_output_tokens=200)
    model = ToolCallingModel(rounds=1)
    graph = react_worker(governor, model, checkpointer=InMemorySaver(), agent=spec)
    thread = {"configurable": {"thread_id": "conversation"}}

    for turn in range(6):
        result = graph.invoke({"messages": [HumanMessage(f"question {turn}")]}, thread)
        assert str(result["messages"][-1].content) == "answer after 1 searches"

    assert len(model.contexts) == 12
    assert max(model.contexts) <= spec.ceiling_tokens
    assert governor.counter.count_messages(result["messages"]) <= spec.ceiling_tokens
    assert result["messages"][0].content == "question 0"  # the head is kept
    assert len(result["messages"]) < 1 + 6 * 3
    kinds = [e.kind for e in recorder.events]
    assert kinds.count("requested") == 6  # one lease per invocation, tools included
    assert "compacted" in kinds
    assert kinds.count("tool.started") == 6
    assert_no_leaks(governor)


def test_a_langchain_agent_is_governed_too() -> None:
    """``create_agent`` sends each tool call to its tools node; that node runs in the
    lease of the model node that asked for the calls, and its results are reduced."""
    governor = make_governor()
    recorder = Recorder(governor, agent="assistant")
    spec = AgentSpec(name="assistant", ceiling_tokens=2_000, tool_output_tokens=200)
    model = ToolCallingModel()
    graph = govern(create_agent(model, tools=[search]), governor, {"model": spec})

    result = graph.invoke({"messages": [HumanMessage("task")]})

    assert str(result["messages"][-1].content) == "answer after 2 searches"
    results = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert [governor.counter.count(str(m.content)) <= 200 for m in results] == [True, True]
    assert max(model.contexts) <= spec.ceiling_tokens
    kinds = [e.kind for e in recorder.events]
    assert kinds.count("requested") == 1
    assert kinds.count("summarized") == 2
    assert kinds.count("tool.started") == 2
    assert_no_leaks(governor)


def test_agents_taking_turns_never_deadlock() -> None:
    """Memory for one agent at a time: ``a`` then ``b`` then ``a`` again. Each keeps its
    lease across its turns, parked in between, so neither waits on the other."""
    governor = Governor(FakeBackend(num_blocks=256), config=GovernorConfig(admission_timeout_s=10))
    recorder = Recorder(governor, agent="a")
    first = AgentSpec(name="a", ceiling_tokens=2_000)  # 125 of 230 usable blocks
    second = AgentSpec(name="b", ceiling_tokens=2_000)

    def turn(name: str) -> Callable[[WorkerState], dict[str, Any]]:
        return lambda state: {"messages": [AIMessage(f"{name} at turn {len(state['messages'])}")]}

    builder = StateGraph(WorkerState)
    builder.add_node("a", turn("a"))
    builder.add_node("b", turn("b"))
    builder.add_edge(START, "a")
    builder.add_edge("b", "a")
    builder.add_conditional_edges("a", lambda state: END if len(state["messages"]) > 3 else "b")
    graph = govern(builder, governor, {"a": first, "b": second})

    result = graph.invoke({"messages": [HumanMessage("go")], "reports": []})

    assert [m.content for m in result["messages"][1:]] == [
        "a at turn 1",
        "b at turn 2",
        "a at turn 3",
    ]
    kinds = ["requested", "admitted", "parked", "resumed", "parked", "released"]
    assert recorder.kinds("a") == kinds
    assert recorder.kinds("b") == ["requested", "admitted", "parked", "released"]
    assert governor.admission.counts()[2] == 1  # never both at once
    assert_no_leaks(governor)


def test_an_impossible_topology_is_refused_before_it_runs() -> None:
    governor = Governor(FakeBackend(num_blocks=256))  # 230 usable blocks of 16 tokens
    big = AgentSpec(name="worker", ceiling_tokens=2_000)  # 125 blocks; 3 at once need 375
    worker = react_worker(governor, ToolCallingModel(), agent=big)

    def fan_out(state: Outer) -> list[Send]:
        return [Send("worker", {"messages": []})]

    builder = StateGraph(Outer)
    builder.add_node("planner", lambda state: {})
    builder.add_node("worker", worker)
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", fan_out)
    with pytest.raises(TopologyError, match="'planner' fanning out to 'worker'") as caught:
        govern(builder, governor, {"planner": PLANNER, "worker": big})
    assert "max_fanout=1" in caught.value.suggestion

    # Without an annotation to read, the pair is given explicitly.
    builder = StateGraph(Outer)
    builder.add_node("planner", lambda state: {})
    builder.add_node("worker", worker)
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", lambda state: [Send("worker", {"messages": []})])
    agents = {"planner": PLANNER, "worker": big}
    assert isinstance(govern(builder, governor, agents), GovernedGraph)
    with pytest.raises(TopologyError):
        govern(builder, governor, agents, topology=[("planner", "worker", 2)])
    govern(builder, governor, agents, topology=[("planner", "worker", 1)])


def test_govern_refuses_what_does_not_match_the_graph() -> None:
    governor = make_governor()
    worker = react_worker(governor, ToolCallingModel(), agent=WORKER)
    with pytest.raises(ConfigError, match="does not have"):
        govern(worker.builder, governor, {"writer": WORKER})
    with pytest.raises(ConfigError, match="already governed"):
        govern(worker, governor)
    with pytest.raises(ConfigError, match="AgentSpec"):
        react_worker(governor, ToolCallingModel(), agent="worker")  # type: ignore[arg-type]
    builder = StateGraph(Outer)
    builder.add_node("planner", lambda state: {})
    builder.add_edge(START, "planner")
    with pytest.raises(ConfigError, match="does not govern"):
        govern(builder, governor, {"planner": PLANNER}, topology=[("planner", "worker", 1)])


def test_with_config_keeps_the_governance() -> None:
    governor = make_governor()
    recorder = Recorder(governor, agent="agent")
    spec = AgentSpec(name="agent", ceiling_tokens=2_000, tool_output_tokens=200)
    graph = react_worker(governor, ToolCallingModel(rounds=1), agent=spec)
    configured = graph.with_config(recursion_limit=50)
    assert isinstance(configured, GovernedGraph)
    assert configured.governor is governor
    configured.invoke({"messages": [HumanMessage("task")], "reports": []})
    assert [e.kind for e in recorder.events].count("released") == 1
    assert_no_leaks(governor)


# -- model calls inside a governed node ------------------------------------------------------
def test_a_governed_chat_model_in_a_node_calls_in_the_nodes_lease() -> None:
    """The worker's model names its agent but no lease: it calls in the lease its node
    runs in (the backend sees that lease's budget), and the call is recorded once."""
    governor = make_governor()
    recorder = Recorder(governor)
    backend = governor.backend
    assert isinstance(backend, FakeBackend)
    model = GovernedChatModel(governor, agent=WORKER, max_tokens=4)
    leases: list[Any] = []

    def worker(state: WorkerState) -> dict[str, Any]:
        leases.append(current_lease())
        return {"messages": [model.invoke(state["messages"])]}

    async def aworker(state: WorkerState) -> dict[str, Any]:
        leases.append(current_lease())
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(WorkerState)
    builder.add_node("worker", sync_and_async(worker, aworker))
    builder.add_edge(START, "worker")
    builder.add_edge("worker", END)
    graph = govern(builder, governor, {"worker": WORKER})

    graph.invoke({"messages": [HumanMessage("one")], "reports": []})
    asyncio.run(graph.ainvoke({"messages": [HumanMessage("two")], "reports": []}))

    assert current_lease() is None  # only within the node
    assert len(leases) == 2 and all(lease is not None for lease in leases)
    assert [call.budget for call in backend.calls] == [lease.budget for lease in leases]
    assert recorder.kinds("worker").count("requested") == 2  # the model took none of its own
    released = [e for e in recorder.events if e.kind == "released" and e.agent == "worker"]
    assert [e.attributes["num_calls"] for e in released] == [1, 1]  # not counted twice
    assert_no_leaks(governor)


class UsageModel(ToolCallingModel):
    """``ToolCallingModel`` that reports usage, as most providers' chat models do."""

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        reply = super()._reply(messages)
        usage = {"input_tokens": 100 + len(messages), "output_tokens": 7, "total_tokens": 0}
        usage["total_tokens"] = usage["input_tokens"] + 7
        return reply.model_copy(update={"usage_metadata": usage})


def test_a_nodes_model_usage_is_recorded_and_its_context_counted() -> None:
    """A chat model of its own that reports ``usage_metadata``: each reply is one
    ``call.finished`` with that usage; the lease's context is the counted state."""
    governor = make_governor()
    recorder = Recorder(governor)
    worker = react_worker(governor, UsageModel(), agent=WORKER)

    result = worker.invoke({"messages": [HumanMessage("task")], "reports": []})

    finished = [e for e in recorder.events if e.kind == "call.finished"]
    assert [e.attributes["prompt_tokens"] for e in finished] == [101, 103, 105]
    assert all(e.attributes["completion_tokens"] == 7 for e in finished)
    (released,) = [e for e in recorder.events if e.kind == "released"]
    assert released.attributes["num_calls"] == 3
    counted = governor.counter.count_messages(result["messages"])
    assert released.attributes["tokens_in_context"] == counted
    assert_no_leaks(governor)


def test_a_governed_agent_in_a_node_works_in_the_nodes_lease() -> None:
    """A ``create_agent`` agent with ``GovernorMiddleware`` for the node's own agent takes
    no second lease: its model and tool calls run in the node's, recorded once."""
    governor = make_governor()
    recorder = Recorder(governor)
    model = ToolCallingModel(rounds=1)
    agent = create_agent(model, [search], middleware=[GovernorMiddleware(governor, agent=WORKER)])

    def worker(state: WorkerState) -> dict[str, Any]:
        done = agent.invoke({"messages": state["messages"]})
        return {"messages": done["messages"][len(state["messages"]) :]}

    builder = StateGraph(WorkerState)
    builder.add_node("worker", worker)
    builder.add_edge(START, "worker")
    builder.add_edge("worker", END)
    graph = govern(builder, governor, {"worker": WORKER})

    result = graph.invoke({"messages": [HumanMessage("task")], "reports": []})

    assert str(result["messages"][-1].content) == "answer after 1 searches"
    kinds = recorder.kinds("worker")
    assert kinds.count("requested") == 1
    assert kinds.count("tool.started") == 1
    (released,) = [e for e in recorder.events if e.kind == "released"]
    assert released.attributes["num_calls"] == 2
    assert_no_leaks(governor)
