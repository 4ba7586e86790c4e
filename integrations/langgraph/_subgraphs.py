"""Which graph, outer or nested, each node named in ``govern(agents=...)`` belongs to.

Private to integrations/. A compiled graph added as a node (``add_node("team",
compiled)``) is a subgraph that ``govern`` reaches: a name in ``agents=`` (or
``topology=``) is

- a node of the graph itself, when it has one by that name;
- else a path ``"team/worker"`` (deeper: ``"team/squad/worker"``) through the
  subgraph nodes to a node of a subgraph;
- else a bare node name found in exactly one subgraph, at any depth. A name found in
  two is ambiguous, and refused with the paths to write instead.

The names that go into one subgraph are handed to ``govern`` for that subgraph, relative
to it, and the governed subgraph takes the node's place: its nodes get the caps, parking
and ceilings they get when the subgraph is governed on its own and added as a node.
LangGraph lists a graph's subgraphs (``Pregel.get_subgraphs``), including those a node's
function calls; only a subgraph that is the node itself can be replaced, so the nodes of
one called inside a function are not reached (the error for an unknown name says so:
govern that subgraph on its own and call the governed graph). Nor are those of a subgraph
governed already: they are governed by its own ``govern``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from langgraph.graph.state import CompiledStateGraph

from governor import AgentSpec, ConfigError
from integrations.langgraph.governed_graph import GovernedGraph

__all__ = ["SEP", "Placement", "place"]

SEP = "/"


@dataclass(slots=True)
class Placement:
    """``agents=`` and ``topology=`` of one ``govern`` call, split by graph."""

    own: dict[str, AgentSpec] = field(default_factory=dict)  # this graph's node -> agent
    # subgraph node -> its own agents=, by names relative to it
    nested: dict[str, dict[str, AgentSpec]] = field(default_factory=dict)
    topology: list[tuple[str, str, int]] | None = None  # this graph's pairs, when given
    # subgraph node -> its topology=, for those topology= has pairs of
    nested_topology: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)

    @property
    def paths(self) -> dict[str, AgentSpec]:
        """Node or ``subgraph/node`` path -> its agent, for every node governed."""
        paths = dict(self.own)
        for node, agents in self.nested.items():
            paths.update({f"{node}{SEP}{name}": spec for name, spec in agents.items()})
        return paths


def place(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    agents: Mapping[str, AgentSpec],
    topology: Iterable[tuple[str, str, int]] | None,
) -> Placement:
    """Where each named node is (module docstring); ``ConfigError`` for a name that is not
    a node of the graph or of one of its subgraphs, or that is ambiguous."""
    index = _Index(graph)
    placement = Placement()
    placed: dict[tuple[str, ...], str] = {}  # path -> the name agents= gave it
    for name, spec in agents.items():
        path = index.resolve(name, "agents")
        if path in placed:
            raise ConfigError(
                f"agents names node {SEP.join(path)!r} twice (as {placed[path]!r} and "
                f"{name!r}); name it once",
                setting="agents",
            )
        placed[path] = name
        if len(path) == 1:
            placement.own[path[0]] = spec
        else:
            placement.nested.setdefault(path[0], {})[SEP.join(path[1:])] = spec
    if topology is not None:
        placement.topology = []
        for entry in topology:
            if not isinstance(entry, tuple) or len(entry) != 3:
                placement.topology.append(entry)  # the topology check says what is wrong
                continue
            planner, worker, num_workers = entry
            first, second = index.find(planner), index.find(worker)
            if first is None or second is None or (len(first) == 1 and len(second) == 1):
                # a name that is no node stays as written: the check says it is not governed
                if first is None or second is None:
                    placement.topology.append((planner, worker, num_workers))
                else:  # both nodes of this graph: one name each
                    placement.topology.append((first[0], second[0], num_workers))
            elif len(first) > 1 and len(second) > 1 and first[0] == second[0]:
                pair = (SEP.join(first[1:]), SEP.join(second[1:]))
                placement.nested_topology.setdefault(first[0], []).append((*pair, num_workers))
            else:
                raise ConfigError(
                    f"topology pairs {SEP.join(first)!r} with {SEP.join(second)!r}, which are "
                    "in different graphs; a node sends only to nodes of its own graph",
                    setting="topology",
                )
    return placement


class _Index:
    """A graph's own nodes and the paths to the nodes of its reachable subgraphs."""

    def __init__(self, graph: CompiledStateGraph[Any, Any, Any, Any]) -> None:
        self.own = [n for n in graph.builder.nodes]
        self.paths: list[tuple[str, ...]] = []
        self.unreached: list[str] = []  # why some subgraphs' nodes are not listed
        self._walk(graph, ())

    def _walk(self, graph: CompiledStateGraph[Any, Any, Any, Any], prefix: tuple[str, ...]) -> None:
        for node, subgraph in graph.get_subgraphs():
            where = SEP.join((*prefix, node))
            if isinstance(subgraph, GovernedGraph):
                self.unreached.append(f"{where!r} is governed already (by its own govern())")
            elif graph.nodes[node].bound is not subgraph:
                self.unreached.append(
                    f"{where!r} calls a subgraph inside its function (govern that subgraph "
                    "on its own and call the governed graph there)"
                )
            elif isinstance(subgraph, CompiledStateGraph):
                path = (*prefix, node)
                self.paths.extend((*path, name) for name in subgraph.builder.nodes)
                self._walk(subgraph, path)
            else:  # a graph of the functional API, a remote graph: no nodes to wrap
                self.unreached.append(
                    f"{where!r} is a {type(subgraph).__name__}, not a compiled StateGraph"
                )

    def resolve(self, name: object, setting: str) -> tuple[str, ...]:
        path = self.find(name, setting)
        if path is None:
            raise ConfigError(self._unknown(name, setting), setting=setting)
        return path

    def find(self, name: object, setting: str = "topology") -> tuple[str, ...] | None:
        """The path to the node ``name`` names; None when there is none; ``ConfigError``
        when there are two."""
        if not isinstance(name, str):
            return None
        if name in self.own:
            return (name,)
        path = tuple(name.split(SEP))
        if path in self.paths:
            return path
        found = [p for p in self.paths if p[-1] == name]
        if len(found) > 1:
            written = ", ".join(repr(SEP.join(p)) for p in found)
            raise ConfigError(
                f"{setting} names node {name!r}, which is in more than one subgraph; "
                f"write it as one of {written}",
                setting=setting,
            )
        return found[0] if found else None

    def _unknown(self, name: object, setting: str) -> str:
        known = ", ".join(repr(n) for n in self.own) or "none"
        text = f"{setting} names node {name!r}, which the graph does not have (its nodes: {known}"
        if self.paths:
            nested = ", ".join(repr(SEP.join(p)) for p in self.paths)
            text += f"; in its subgraphs: {nested}"
        text += ")"
        if self.unreached:
            text += "; not reached: " + "; ".join(self.unreached)
        return text
