"""Which governed nodes of a LangGraph graph fan out to which, and whether that fits.

Private to integrations/. ``Send`` targets are chosen at run time, so they cannot be read
from a graph exactly. A pair ``(planner, worker)`` is inferred when the governed node
``planner`` has a conditional edge whose function is annotated to return ``Send``
(``-> list[Send]``): its targets are the edge's ``path_map`` when it has one, else every
other governed node of another agent that is not a ``ToolNode``. An explicit
``topology=[("planner", "worker", num_workers)]`` replaces the inference. With no
``num_workers``, a pair is checked at the planner's ``max_fanout``, the most workers it
runs at once whatever it sends.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from langgraph.prebuilt import ToolNode
from langgraph.types import Send

from governor import AgentSpec, ConfigError, Governor, TopologyError

__all__ = ["FanoutPair", "check_pairs", "fanout_pairs"]


@dataclass(frozen=True, slots=True)
class FanoutPair:
    planner: str  # node names
    worker: str
    num_workers: int


def fanout_pairs(
    graph: Any,
    agents: Mapping[str, AgentSpec],
    topology: Iterable[tuple[str, str, int]] | None,
) -> tuple[FanoutPair, ...]:
    """The explicit pairs when ``topology`` is given, else those inferred from ``graph``."""
    if topology is not None:
        return tuple(_explicit(entry, agents) for entry in topology)
    tool_nodes = {name for name, node in graph.nodes.items() if isinstance(node.bound, ToolNode)}
    pairs = []
    for planner, branches in graph.builder.branches.items():
        spec = agents.get(planner)
        if spec is None:
            continue
        for branch in branches.values():
            if not _returns_send(branch.path):
                continue
            targets = list(branch.ends.values()) if branch.ends else sorted(agents)
            for worker in targets:
                other = agents.get(worker)
                if other is None or worker in tool_nodes or other.name == spec.name:
                    continue
                pairs.append(FanoutPair(planner, worker, spec.max_fanout))
    return tuple(dict.fromkeys(pairs))


def check_pairs(
    governor: Governor, agents: Mapping[str, AgentSpec], pairs: Iterable[FanoutPair]
) -> None:
    """Raise ``TopologyError`` for the first pair that cannot fit in the governor's mode
    (with parking: the governor parks a planner while its workers run)."""
    mode = governor.config.mode.value
    for pair in pairs:
        report = governor.check_topology(
            planner=agents[pair.planner], worker=agents[pair.worker], num_workers=pair.num_workers
        )
        try:
            report.raise_if_unfit(mode, parking=True)
        except TopologyError as exc:
            raise TopologyError(
                f"graph node {pair.planner!r} fanning out to {pair.worker!r}: {exc.reason}",
                exc.suggestion,
            ) from exc


def _explicit(entry: object, agents: Mapping[str, AgentSpec]) -> FanoutPair:
    if not isinstance(entry, tuple) or len(entry) != 3:
        raise ConfigError(
            f"each topology entry is (planner_node, worker_node, num_workers), got {entry!r}",
            setting="topology",
        )
    planner, worker, num_workers = entry
    for node in (planner, worker):
        if node not in agents:
            raise ConfigError(
                f"topology names node {node!r}, which agents= does not govern; govern it "
                f"(agents={{{node!r}: AgentSpec(...)}}) or leave it out",
                setting="topology",
            )
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ConfigError.below_minimum("num_workers", num_workers, 1)
    return FanoutPair(planner, worker, num_workers)


def _returns_send(path: object) -> bool:
    func = getattr(path, "func", None) or getattr(path, "afunc", None)
    if func is None:
        return False
    try:
        annotation = typing.get_type_hints(func).get("return")
    except Exception:  # an annotation that does not resolve: read it as written
        annotation = inspect.signature(func).return_annotation
    return _mentions_send(annotation)


def _mentions_send(annotation: object) -> bool:
    if annotation is Send:
        return True
    if isinstance(annotation, str):
        return "Send" in annotation
    return any(_mentions_send(arg) for arg in typing.get_args(annotation))
