"""``govern(graph, governor, agents=...)``: any LangGraph graph, run within the governor.

    graph = govern(builder, governor, agents={"planner": planner, "worker": worker})
    graph.invoke(inputs)        # also ainvoke, stream, astream, batch, with_config

``graph`` is a ``StateGraph`` (compiled here with no options) or a ``CompiledStateGraph``
(its checkpointer, store, interrupts and config are kept). ``agents`` names the graph's
nodes and those of the compiled graphs added as its nodes (its subgraphs, at any depth):
a subgraph's node by its name alone when no node of the graph has that name and one
subgraph only does, else by its path, ``"team/worker"``. Such a subgraph is governed on
its own, in its node's place, so its nodes get what they get when you ``govern`` it and
add it yourself (``integrations.langgraph._subgraphs``). The result is a
``GovernedGraph``, a ``CompiledStateGraph`` whose governed nodes have their runnable
(``PregelNode.bound``) wrapped, and whose ``stream``/``astream`` (which ``invoke`` and
``ainvoke`` run on) open a frame per invocation inside ``governor.run(graph name)``, so
every lease of the invocation carries its run id and traces nest. LangGraph has no
public hook to wrap a node or to tell a ``Send`` task from another, so this rests on a
few of its internals (the node's ``PregelNode.bound``, the ``__pregel_push`` trigger, a
conditional edge's ``BranchSpec``): ``langgraph`` is pinned to the minor version they
were checked on, and tests/integrations/langgraph/test_langgraph_internals.py names each
one.

What a governed node gets (the details live in the private modules named):

- its lease (``integrations.langgraph._frame``): a node reached by ``Send`` gets a lease
  for that execution, a child of the governed node that sent it, so at most the
  sender's ``max_fanout`` of them run at once, counted by ``governor.fanout_limiter``
  across nested subgraphs, threads and event loops (LangGraph's ``max_concurrency``
  is per graph and does not compose). The sender is parked while its children run and
  resumed when it next runs. Any other node keeps one lease per invocation across its
  supersteps, parked between its turns and released when the invocation ends. A
  governed subgraph (one you ``govern`` with the same governor and add as a node, or
  invoke inside a node) joins its parent's run: its nodes of the enclosing node's
  agent share that node's lease, and what it sends counts against the enclosing
  lease's (or the outer sender's) fan-out cap;
- its context (``integrations.langgraph._node``): the messages it saw merged with those
  it returns (by the state's reducer) are counted exactly into
  ``lease.tokens_in_context``; at the ceiling (less the reply's reserve) the
  governor's ceiling policy raises ``CeilingExceeded`` or compacts the state's
  messages;
- tool results (``ToolMessage``) it returns are reduced to the agent's
  ``tool_output_tokens`` before they enter the state. Every ``ToolNode`` of the graph
  is wrapped, named in ``agents=`` or not: it runs in the lease that asked for its
  calls, parked as the governor parks a lease waiting on a tool (``tool_call``).

Before anything runs, ``govern`` checks each planner/worker pair with
``governor.check_topology`` in the governor's admission mode, parking included, and
raises ``TopologyError`` naming the two nodes when the fan-out cannot fit. Pairs are
inferred from conditional edges annotated to return ``Send``
(``integrations.langgraph._topology``); pass
``topology=[("planner", "worker", num_workers)]`` when the graph does not say.

While a governed node runs, its lease is the current lease: ``current_lease()`` returns
it (for ``governor.complete`` and the like), a ``GovernedChatModel`` given no lease calls
in it, and a ``GovernorMiddleware`` agent of the same agent run inside the node works in
it instead of taking a second lease. A model call of another chat model does not pass
through the governor: a lease admits and bounds the agent, the reply's
``usage_metadata``, when it has one, is recorded as the call's usage
(``Governor.record_call``), and the counts above are the lease's context.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.graph.state import CompiledStateGraph, StateGraph
from langgraph.prebuilt import ToolNode

from governor import AgentSpec, ConfigError, Governor, TopologyError
from integrations.langgraph._frame import Governance
from integrations.langgraph._node import GovernedNode
from integrations.langgraph._subgraphs import place
from integrations.langgraph._topology import FanoutPair, check_pairs, fanout_pairs
from integrations.langgraph.governed_graph import GovernedGraph

__all__ = ["GovernedGraph", "govern"]


def govern(
    graph: StateGraph[Any, Any, Any, Any] | CompiledStateGraph[Any, Any, Any, Any],
    governor: Governor,
    agents: Mapping[str, AgentSpec] | None = None,
    *,
    topology: Iterable[tuple[str, str, int]] | None = None,
    messages_key: str = "messages",
) -> GovernedGraph:
    """``graph`` with each node named in ``agents`` run within its agent's lease.

    ``agents``: node name (or ``subgraph/node`` path, see the module docstring) -> its
    agent. ``topology``: the planner/worker pairs to check, as ``(planner_node,
    worker_node, num_workers)``, in place of those inferred from the graph (a subgraph's
    pairs, written by path or name as in ``agents``, in place of that subgraph's).
    ``messages_key``: the state key (and node input/output key) that holds the
    conversation, in the graph and its subgraphs.
    Raises ``ConfigError`` for arguments that do not match the graph and
    ``TopologyError`` for a fan-out that cannot fit.
    """
    if not isinstance(governor, Governor):
        raise ConfigError(
            f"govern() needs a governor.Governor, got {type(governor).__name__}",
            setting="governor",
        )
    if isinstance(graph, GovernedGraph):
        raise ConfigError(
            "this graph is already governed; govern the original graph once, with every "
            "agent in agents=",
            setting="graph",
        )
    if isinstance(graph, StateGraph):
        graph = graph.compile()
    if not isinstance(graph, CompiledStateGraph):
        raise ConfigError(
            f"govern() takes a langgraph StateGraph or CompiledStateGraph, got "
            f"{type(graph).__name__}",
            setting="graph",
        )
    if not isinstance(messages_key, str) or not messages_key:
        raise ConfigError(
            f"messages_key must name a state key, got {messages_key!r}", setting="messages_key"
        )
    placement = place(graph, _check_agents(agents or {}), topology)
    specs = placement.own
    pairs = fanout_pairs(graph, specs, placement.topology)
    check_pairs(governor, specs, pairs)
    # A subgraph node whose nodes are named is replaced by that subgraph, governed on its
    # own (integrations.langgraph._subgraphs): the same caps, parking and ceilings.
    subgraphs = {}
    for name in dict.fromkeys([*placement.nested, *placement.nested_topology]):
        subgraph = graph.nodes[name].bound
        assert isinstance(subgraph, CompiledStateGraph)  # place() names no other subgraph
        try:
            subgraphs[name] = govern(
                subgraph,
                governor,
                placement.nested.get(name, {}),
                topology=placement.nested_topology.get(name),
                messages_key=messages_key,
            )
        except TopologyError as exc:
            raise TopologyError(f"in subgraph {name!r}: {exc.reason}", exc.suggestion) from exc
    governance = Governance(
        governor=governor,
        agents=specs,
        parents=_parents(pairs),
        messages_key=messages_key,
        reducer=_reducer(graph.channels.get(messages_key)),
    )
    nodes = dict(graph.nodes)
    for name, node in graph.nodes.items():
        spec = specs.get(name)
        tool_node = isinstance(node.bound, ToolNode)
        bound = subgraphs.get(name, node.bound)
        update: dict[str, Any] = {} if bound is node.bound else {"subgraphs": [bound]}
        if spec is not None or tool_node:
            bound = GovernedNode(bound, node=name, spec=spec, tool_node=tool_node)
        if bound is not node.bound:
            nodes[name] = node.copy({**update, "bound": bound})
    return GovernedGraph._from(graph, nodes, governance, placement.paths)


def _check_agents(agents: Mapping[str, AgentSpec]) -> Mapping[str, AgentSpec]:
    if not isinstance(agents, Mapping):
        raise ConfigError(
            f"agents maps node names to AgentSpec, got {type(agents).__name__}", setting="agents"
        )
    for name, spec in agents.items():
        if not isinstance(spec, AgentSpec):
            raise ConfigError(
                f"agents[{name!r}] must be a governor.AgentSpec, got {type(spec).__name__}",
                setting="agents",
            )
    return agents


def _parents(pairs: Iterable[FanoutPair]) -> dict[str, frozenset[str]]:
    parents: dict[str, set[str]] = {}
    for pair in pairs:
        parents.setdefault(pair.worker, set()).add(pair.planner)
    return {worker: frozenset(planners) for worker, planners in parents.items()}


def _reducer(channel: object) -> object:
    """How a node's messages join the state's: the channel's reducer, None to replace."""
    if isinstance(channel, BinaryOperatorAggregate):
        return channel.operator
    return None
