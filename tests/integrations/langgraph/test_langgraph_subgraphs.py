"""``govern`` on an outer graph reaches the nodes of the compiled subgraphs added as its
nodes, with the real LangGraph runtime.

Each structure is built twice from the same ungoverned parts: once governing every
subgraph on its own (``govern(subgraph)``, then added as a node), once governing only the
outer graph and naming the subgraphs' nodes there. The governor's events must be the same:
the same leases, parents, parking and ceilings. The chat model is the fake of
``langgraph_graphs.py`` (no offline model calls tools); the governor runs on
``FakeBackend``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Send

from governor import AgentSpec, CeilingExceeded, ConfigError, Governor, TopologyError
from governor.testing import FakeBackend
from integrations.langgraph import GovernedGraph, govern
from tests.integrations.langgraph_graphs import (
    PLANNER,
    WORKER,
    Outer,
    Recorder,
    ToolCallingModel,
    WorkerState,
    assert_no_leaks,
    make_governor,
    search,
)

TEAMS, PER_TEAM = 2, 5


def react(model: ToolCallingModel) -> Any:
    """An ungoverned compiled ReAct loop: ``agent`` -> ``tools`` -> ``agent`` ... ->
    ``report``."""

    def agent(state: WorkerState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def report(state: WorkerState) -> dict[str, Any]:
        return {"reports": [list(state["messages"])]}

    builder = StateGraph(WorkerState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([search]))
    builder.add_node("report", report)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: "report"})
    builder.add_edge("tools", "agent")
    builder.add_edge("report", END)
    return builder.compile()


def team(worker: Any) -> StateGraph[Any, Any, Any, Any]:
    """A lead that sends ``PER_TEAM`` tasks to ``worker``."""

    def lead(state: WorkerState) -> list[Send]:
        return [Send("worker", {"messages": [HumanMessage(f"{i}")]}) for i in range(PER_TEAM)]

    builder = StateGraph(WorkerState)
    builder.add_node("worker", worker)
    builder.add_conditional_edges(START, lead)
    builder.add_edge("worker", END)
    return builder


def outer(teams: Any) -> StateGraph[Any, Any, Any, Any]:
    """A planner that sends ``TEAMS`` tasks to ``teams``."""

    def fan_out(state: Outer) -> list[Send]:
        return [Send("team", {"messages": []}) for _ in range(TEAMS)]

    builder = StateGraph(Outer)
    builder.add_node("planner", lambda state: {"rounds": state["rounds"] + 1})
    builder.add_node("team", teams)
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", fan_out)
    builder.add_edge("team", END)
    return builder


def summary(recorder: Recorder) -> tuple[Counter[tuple[str | None, str]], list[Any], set[Any]]:
    """What must not depend on where the governance was written: each agent's event
    counts, the released workers' calls and context, and the workers' parents (by agent)."""
    agents = {e.lease_id: e.agent for e in recorder.events if e.kind == "requested"}
    kinds = Counter((e.agent, e.kind) for e in recorder.events if e.lease_id is not None)
    released = sorted(
        (e.attributes["num_calls"], e.attributes["tokens_in_context"])
        for e in recorder.events
        if e.kind == "released" and e.agent == "worker"
    )
    parents = {
        agents.get(e.attributes["parent_id"])
        for e in recorder.events
        if e.kind == "requested" and e.agent == "worker"
    }
    return kinds, released, parents


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_subgraph_nodes_governed_from_the_outer_graph_as_on_their_own(mode: str) -> None:
    """Two levels down (outer -> team -> worker -> agent): the worker's leases are
    children of the planner within its fan-out cap, each worker's model and tools run in
    its lease, and its tool results are reduced, exactly as when each level is governed
    on its own."""
    inputs = {"rounds": 0, "reports": []}

    def go(graph: Any) -> Any:
        return graph.invoke(inputs) if mode == "invoke" else asyncio.run(graph.ainvoke(inputs))

    own = make_governor()
    own_recorder = Recorder(own)
    worker = govern(react(ToolCallingModel(rounds=1)), own, {"agent": WORKER})
    governed_team = govern(team(worker), own, {"worker": WORKER})
    own_result = go(govern(outer(governed_team), own, {"planner": PLANNER}))
    assert_no_leaks(own)

    governor = make_governor()
    recorder = Recorder(governor)
    ungoverned = outer(team(react(ToolCallingModel(rounds=1)).builder.compile()).compile())
    # "worker" is found in one subgraph only; the worker's own node is written as a path.
    agents = {"planner": PLANNER, "worker": WORKER, "team/worker/agent": WORKER}
    graph = govern(ungoverned, governor, agents)
    assert dict(graph.agents) == {
        "planner": PLANNER,
        "team/worker": WORKER,
        "team/worker/agent": WORKER,
    }
    result = go(graph)
    assert_no_leaks(governor)

    assert len(result["reports"]) == len(own_result["reports"]) == TEAMS * PER_TEAM
    results = [m for r in result["reports"] for m in r if isinstance(m, ToolMessage)]
    assert len(results) == TEAMS * PER_TEAM
    assert max(governor.counter.count(str(m.content)) for m in results) <= 200
    kinds, released, parents = summary(recorder)
    assert kinds[("worker", "requested")] == TEAMS * PER_TEAM
    assert released == [(2, released[0][1])] * (TEAMS * PER_TEAM)  # 2 calls each, one size
    assert parents == {"planner"}
    assert 1 < recorder.peak <= PLANNER.max_fanout
    assert (kinds, released, parents) == summary(own_recorder)


def test_a_subgraph_node_held_across_turns_is_parked_between_them() -> None:
    """A node that is no Send target keeps one lease across its turns, parked between
    them (a ReAct agent parks while its tools run), wherever it was governed."""
    spec = AgentSpec(name="agent", ceiling_tokens=2_000, tool_output_tokens=200)

    def wrapper(inner: Any) -> Any:
        builder = StateGraph(WorkerState)
        builder.add_node("inner", inner)
        builder.add_edge(START, "inner")
        builder.add_edge("inner", END)
        return builder

    inputs = {"messages": [HumanMessage("task")], "reports": []}
    own = make_governor(park_after_s=0)
    own_recorder = Recorder(own, agent="agent")
    inner = govern(react(ToolCallingModel(rounds=2)), own, {"agent": spec})
    govern(wrapper(inner), own, {}).invoke(inputs)

    governor = make_governor(park_after_s=0)
    recorder = Recorder(governor, agent="agent")
    govern(wrapper(react(ToolCallingModel(rounds=2))), governor, {"agent": spec}).invoke(inputs)

    kinds = recorder.kinds("agent")
    assert kinds.count("requested") == 1 and kinds.count("parked") >= 2
    assert kinds == own_recorder.kinds("agent")
    assert_no_leaks(governor)


def test_a_subgraph_nodes_ceiling_holds() -> None:
    """Without a tool-output budget a 20,000-character result passes the ceiling of a
    worker two levels down: refused, and nothing is left held."""
    governor = make_governor()
    unbounded = AgentSpec(name="worker", ceiling_tokens=2_000)
    graph = outer(team(react(ToolCallingModel())).compile())
    agents = {"planner": PLANNER, "team/worker": unbounded, "agent": unbounded}
    governed = govern(graph, governor, agents)
    with pytest.raises(CeilingExceeded) as caught:
        governed.invoke({"rounds": 0, "reports": []})
    assert (caught.value.agent, caught.value.ceiling) == ("worker", 2_000)
    assert_no_leaks(governor)


def test_a_subgraph_fanout_that_cannot_fit_is_refused_from_the_outer_graph() -> None:
    governor = Governor(FakeBackend(num_blocks=256))  # 230 usable blocks of 16 tokens
    lead = AgentSpec(name="lead", ceiling_tokens=500, max_fanout=3)
    big = AgentSpec(name="worker", ceiling_tokens=2_000)  # 125 blocks; 3 at once need 375

    def fan_out(state: WorkerState) -> list[Send]:
        return [Send("worker", {"messages": []})]

    builder = StateGraph(WorkerState)
    builder.add_node("lead", lambda state: {})
    builder.add_node("worker", lambda state: {})
    builder.add_edge(START, "lead")
    builder.add_conditional_edges("lead", fan_out)
    squad = builder.compile()
    with pytest.raises(TopologyError, match="in subgraph 'team': graph node 'lead' fanning"):
        govern(outer(squad), governor, {"lead": lead, "worker": big})
    with pytest.raises(TopologyError, match="in subgraph 'team'"):
        govern(outer(squad), governor, {"lead": lead, "worker": big}, topology=[])
    fits = [("team/lead", "worker", 1)]  # a pair in a subgraph, by path or name
    graph = govern(outer(squad), governor, {"lead": lead, "worker": big}, topology=fits)
    assert isinstance(graph, GovernedGraph)


def two_teams() -> StateGraph[Any, Any, Any, Any]:
    def worker(state: WorkerState) -> dict[str, Any]:
        return {"messages": [AIMessage("done")]}

    def squad() -> Any:
        builder = StateGraph(WorkerState)
        builder.add_node("worker", worker)
        builder.add_edge(START, "worker")
        builder.add_edge("worker", END)
        return builder.compile()

    called = squad()
    builder = StateGraph(WorkerState)
    builder.add_node("red", squad())
    builder.add_node("blue", squad())
    builder.add_node("calls", lambda state: called.invoke(state))
    builder.add_edge(START, "red")
    builder.add_edge("red", "blue")
    builder.add_edge("blue", "calls")
    builder.add_edge("calls", END)
    return builder


def test_a_name_in_two_subgraphs_is_written_as_a_path() -> None:
    governor = make_governor()
    written = "more than one subgraph; write it as one of 'red/worker', 'blue/worker'"
    with pytest.raises(ConfigError, match=written):
        govern(two_teams(), governor, {"worker": WORKER})

    recorder = Recorder(governor)
    graph = govern(two_teams(), governor, {"red/worker": WORKER})
    graph.invoke({"messages": [HumanMessage("go")], "reports": []})
    # Only red's worker ran in a lease: one lease, one call counted.
    kinds = recorder.kinds("worker")
    assert kinds.count("requested") == 1 and kinds.count("released") == 1
    assert_no_leaks(governor)


def test_an_unknown_name_lists_the_nested_nodes() -> None:
    governor = make_governor()
    with pytest.raises(ConfigError) as caught:
        govern(two_teams(), governor, {"writer": WORKER})
    message = str(caught.value)
    assert "the graph does not have" in message
    assert "its nodes: 'red', 'blue', 'calls'" in message
    assert "in its subgraphs: 'red/worker', 'blue/worker'" in message
    assert "'calls' calls a subgraph inside its function" in message
    teams = outer(team(react(ToolCallingModel())).compile())
    with pytest.raises(ConfigError, match="names node 'team/worker' twice"):
        govern(teams, governor, {"team/worker": WORKER, "worker": WORKER})
    with pytest.raises(ConfigError, match="in different graphs"):
        agents = {"red/worker": WORKER, "blue/worker": WORKER}
        govern(two_teams(), governor, agents, topology=[("red/worker", "blue/worker", 1)])


def test_the_nodes_of_a_governed_subgraph_are_its_own() -> None:
    """A subgraph governed already is left to its own ``govern``; naming its nodes again
    from outside says so."""
    governor = make_governor()
    inner = govern(react(ToolCallingModel()), governor, {"agent": WORKER})
    builder = StateGraph(WorkerState)
    builder.add_node("inner", inner)
    builder.add_edge(START, "inner")
    with pytest.raises(ConfigError, match="'inner' is governed already"):
        govern(builder, governor, {"agent": WORKER})
