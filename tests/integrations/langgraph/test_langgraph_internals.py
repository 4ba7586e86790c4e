"""Each LangGraph internal that kvgov relies on, checked by name against the installed
LangGraph, so that an upgrade fails here first, saying what changed and who relies on it.

LangGraph offers no public hook to wrap a node's runnable or to tell a task reached by
``Send`` from any other, so ``govern`` uses the internals below; ``langgraph`` is pinned in
pyproject.toml to the range these checks passed on. Where one fails after an upgrade:
adapt the module named, then widen the pin. Real LangGraph, no kvgov in the graphs
(except the last check, of the module that uses the internal).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Send
from typing_extensions import TypedDict

from integrations.langgraph import _frame
from integrations.langgraph._messages import is_add_messages

LANGGRAPH = version("langgraph")


def relied(holds: bool, internal: str, user: str, purpose: str) -> None:
    """Fail with what changed, who relies on it and what for."""
    if not holds:
        pytest.fail(
            f"langgraph {LANGGRAPH}: {internal} is no longer as kvgov expects. "
            f"{user} relies on it to {purpose}. Adapt {user}, then widen the langgraph "
            "pin in pyproject.toml.",
            pytrace=False,
        )


class State(TypedDict):
    seen: Annotated[list[tuple[str, Any, Any]], operator.add]


def recording(name: str) -> Callable[[State, RunnableConfig], dict[str, Any]]:
    def node(state: State, config: RunnableConfig) -> dict[str, Any]:
        metadata = config.get("metadata") or {}
        triggers = tuple(metadata.get("langgraph_triggers") or ())
        return {"seen": [(name, triggers, metadata.get("langgraph_step"))]}

    return node


def test_a_send_task_is_told_by_its_trigger_and_step() -> None:
    """``integrations.langgraph._frame._pushed`` and ``Frame._sender``."""
    try:
        from langgraph._internal._constants import PUSH
    except ImportError:
        PUSH = None  # reported below
    relied(
        PUSH == _frame._PUSH,
        "the constant langgraph._internal._constants.PUSH ('__pregel_push')",
        "integrations/langgraph/_frame.py (_PUSH)",
        "tell a task reached by Send from any other",
    )
    builder = StateGraph(State)
    builder.add_node("planner", recording("planner"))
    builder.add_node("worker", recording("worker"))
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", lambda state: [Send("worker", {"seen": []})])
    builder.add_edge("worker", END)
    seen = builder.compile().invoke({"seen": []})["seen"]
    planner = next(s for s in seen if s[0] == "planner")
    workers = [s for s in seen if s[0] == "worker"]
    relied(
        len(workers) == 1
        and workers[0][1][:1] == (_frame._PUSH,)
        and planner[1][:1] != (_frame._PUSH,),
        "config['metadata']['langgraph_triggers'][0] of a Send task (PUSH; of no other task)",
        "integrations/langgraph/_frame.py (_pushed)",
        "give a Send task a child lease of its sender",
    )
    relied(
        isinstance(planner[2], int) and workers[0][2] == planner[2] + 1,
        "config['metadata']['langgraph_step'] (an int; a Send task runs the step after its sender)",
        "integrations/langgraph/_frame.py (Frame._sender, Frame._note)",
        "find the lease that sent a task",
    )


def test_a_nodes_runnable_can_be_replaced_in_a_compiled_graph() -> None:
    """``integrations.langgraph.govern`` and ``GovernedGraph._from``."""
    from langgraph.graph.state import CompiledStateGraph

    builder = StateGraph(State)
    builder.add_node("node", recording("original"))
    builder.add_edge(START, "node")
    builder.add_edge("node", END)
    graph = builder.compile()
    node = graph.nodes["node"]
    relied(
        hasattr(node, "bound") and hasattr(node, "copy") and hasattr(node, "subgraphs"),
        "PregelNode.bound, PregelNode.copy(update) and PregelNode.subgraphs",
        "integrations/langgraph/graph.py (govern)",
        "run each governed node's runnable inside its lease",
    )
    replacement = RunnableLambda(lambda state: {"seen": [("replaced", (), None)]})
    # As GovernedGraph._from does: a shallow copy of the compiled graph, other nodes.
    copy = object.__new__(CompiledStateGraph)
    copy.__dict__.update(graph.__dict__)
    copy.nodes = {**graph.nodes, "node": node.copy({"bound": replacement})}
    relied(
        [s[0] for s in copy.invoke({"seen": []})["seen"]] == ["replaced"]
        and [s[0] for s in graph.invoke({"seen": []})["seen"]] == ["original"],
        "a compiled graph copied by its __dict__ with a node's PregelNode.copy({'bound': "
        "...}) in Pregel.nodes, which runs the new bound and leaves the original alone",
        "integrations/langgraph/graph.py (govern, GovernedGraph._from)",
        "govern a compiled graph without recompiling it (keeping its checkpointer, store, "
        "interrupts)",
    )

    tools = ToolNode([])
    sub = StateGraph(State)
    sub.add_node("inner", recording("inner"))
    sub.add_edge(START, "inner")
    compiled_sub = sub.compile()
    outer = StateGraph(State)
    outer.add_node("tools", tools)
    outer.add_node("team", compiled_sub)
    outer.add_edge(START, "team")
    outer_graph = outer.compile()
    relied(
        outer_graph.nodes["tools"].bound is tools,
        "PregelNode.bound of a node added as a ToolNode (the ToolNode itself)",
        "integrations/langgraph/graph.py (govern) and integrations/langgraph/_topology.py",
        "run every ToolNode in the lease that asked for its calls",
    )
    relied(
        outer_graph.nodes["team"].bound is compiled_sub
        and dict(outer_graph.get_subgraphs()) == {"team": compiled_sub},
        "PregelNode.bound of a node added as a compiled graph (the graph itself), listed "
        "by Pregel.get_subgraphs()",
        "integrations/langgraph/_subgraphs.py",
        "reach the nodes of a subgraph added as a node and govern it in the node's place",
    )


def test_invoke_runs_on_stream_with_its_config() -> None:
    """``GovernedGraph.invoke``/``ainvoke`` and ``_Invocation.take``: the invocation they
    open is taken by the stream call LangGraph makes with their config."""
    from langgraph.graph.state import CompiledStateGraph

    marker = object()
    streamed: list[object] = []

    class Recording(CompiledStateGraph):  # type: ignore[type-arg]
        def stream(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
            streamed.append(((config or {}).get("configurable") or {}).get("marker"))
            return super().stream(input, config, **kwargs)

    builder = StateGraph(State)
    builder.add_node("node", recording("node"))
    builder.add_edge(START, "node")
    graph = builder.compile()
    recorded = object.__new__(Recording)
    recorded.__dict__.update(graph.__dict__)
    recorded.invoke({"seen": []}, {"configurable": {"marker": marker}})
    relied(
        streamed == [marker],
        "Pregel.invoke running on self.stream once, with the config it was given",
        "integrations/langgraph/graph.py (GovernedGraph.invoke, _Invocation.take)",
        "open one invocation per invoke, not one more for its stream",
    )
    configured = recorded.with_config(recursion_limit=5)
    relied(
        type(configured) is Recording,
        "Pregel.with_config building its result with self.copy",
        "integrations/langgraph/graph.py (GovernedGraph.copy)",
        "keep the governance of a graph given a config",
    )


def test_the_messages_reducer_is_read_from_the_channel() -> None:
    """``integrations.langgraph.graph._reducer``."""
    from langgraph.channels.binop import BinaryOperatorAggregate

    builder = StateGraph(MessagesState)
    builder.add_node("node", lambda state: {})
    builder.add_edge(START, "node")
    channel = builder.compile().channels.get("messages")
    relied(
        isinstance(channel, BinaryOperatorAggregate)
        and is_add_messages(getattr(channel, "operator", None)),
        "CompiledStateGraph.channels[key], a BinaryOperatorAggregate whose .operator is the "
        "state's reducer (add_messages for MessagesState)",
        "integrations/langgraph/graph.py (_reducer) and integrations/langgraph/_messages.py",
        "count a node's context as the state will hold it",
    )
    relied(
        add_messages([HumanMessage("a", id="1")], [HumanMessage("b", id="2")])[-1].content == "b",
        "langgraph.graph.message.add_messages appending new messages",
        "integrations/langgraph/_node.py (_appended)",
        "count an appended context without calling the reducer",
    )


def test_a_conditional_edge_keeps_its_function_and_path_map() -> None:
    """``integrations.langgraph._topology.fanout_pairs``."""

    def fan_out(state: State) -> list[Send]:
        return [Send("worker", {"seen": []})]

    builder = StateGraph(State)
    builder.add_node("planner", recording("planner"))
    builder.add_node("worker", recording("worker"))
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", fan_out, ["worker"])
    graph = builder.compile()
    branches = getattr(graph.builder, "branches", {}).get("planner") or {}
    (branch,) = branches.values() if len(branches) == 1 else (None,)
    path = getattr(branch, "path", None)
    relied(
        branch is not None
        and (getattr(path, "func", None) or getattr(path, "afunc", None)) is fan_out
        and getattr(branch, "ends", None) == {"worker": "worker"},
        "StateGraph.branches[node][name], a BranchSpec whose .path.func is the edge's "
        "function and whose .ends is its path map",
        "integrations/langgraph/_topology.py (fanout_pairs)",
        "infer which node fans out to which, to check that the fan-out fits",
    )


def test_control_flow_and_context_propagation() -> None:
    """``integrations._control_flow`` and ``integrations.langgraph._frame.open_frame``."""
    from langchain_core.runnables.config import var_child_runnable_config
    from langgraph.errors import GraphBubbleUp, GraphInterrupt, ParentCommand

    relied(
        issubclass(GraphInterrupt, GraphBubbleUp) and issubclass(ParentCommand, GraphBubbleUp),
        "langgraph.errors.GraphBubbleUp, the base of GraphInterrupt and ParentCommand",
        "integrations/_control_flow.py (failure)",
        "release a lease an interrupt passes through without calling it a failure",
    )
    ambient: list[object] = []

    def node(state: State) -> dict[str, Any]:
        config = var_child_runnable_config.get() or {}
        ambient.append((config.get("configurable") or {}).get("marker"))
        return {}

    builder = StateGraph(State)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    builder.compile().invoke({"seen": []}, {"configurable": {"marker": "here"}})
    relied(
        ambient == ["here"],
        "langchain_core.runnables.config.var_child_runnable_config holding the node's "
        "config while a node runs",
        "integrations/langgraph/_frame.py (open_frame)",
        "find the enclosing frame of a graph invoked in a node without its config",
    )


def test_the_installed_langgraph_is_in_the_pinned_range() -> None:
    """What passed above is what pyproject.toml pins: a lower and an upper bound."""
    text = (Path(__file__).parents[3] / "pyproject.toml").read_text(encoding="utf-8")
    pin = re.search(r'"langgraph>=([0-9.]+),<([0-9.]+)"', text)
    assert pin is not None, "pyproject.toml must pin langgraph as >=X.Y.Z,<X.(Y+1)"
    low, high = (tuple(int(p) for p in bound.split(".")) for bound in pin.groups())
    installed = tuple(int(p) for p in LANGGRAPH.split(".")[:3])
    relied(
        low <= installed < high,
        f"the installed version, outside the pinned range >={pin[1]},<{pin[2]}",
        "pyproject.toml's langgraph pin",
        "run on a LangGraph these checks passed on",
    )
