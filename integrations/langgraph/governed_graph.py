"""``GovernedGraph``: a compiled LangGraph graph whose nodes run in leases, as ``govern``
makes it; each invocation (``invoke``, ``stream`` and their async forms) opens one frame
inside ``governor.run`` and carries it to the nodes in the config."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from types import TracebackType
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph

from governor import AgentSpec, Governor
from integrations._control_flow import failure
from integrations.langgraph._frame import Governance, open_frame

__all__ = ["GovernedGraph"]

_INVOKED = "__kvgov_graph_invocation"  # "__" keeps it out of LangGraph's run metadata


class GovernedGraph(CompiledStateGraph[Any, Any, Any, Any]):
    """A compiled graph run within a governor; made by ``govern``, used as the graph was."""

    _governance: Governance
    _agents: Mapping[str, AgentSpec]

    @classmethod
    def _from(
        cls,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        nodes: dict[str, Any],
        governance: Governance,
        agents: Mapping[str, AgentSpec],
    ) -> GovernedGraph:
        # A shallow copy keeps everything the graph was compiled with; only the nodes
        # differ. Pregel.copy() would rebuild through __init__, which drops attributes
        # that compile() sets afterwards.
        governed = object.__new__(cls)
        governed.__dict__.update(graph.__dict__)
        governed.nodes = nodes
        governed._governance = governance
        governed._agents = agents
        return governed

    @property
    def governor(self) -> Governor:
        return self._governance.governor

    @property
    def agents(self) -> Mapping[str, AgentSpec]:
        """Node name (``subgraph/node`` for a subgraph's) -> the agent it runs as."""
        return self._agents

    def copy(self, update: dict[str, Any] | None = None) -> GovernedGraph:
        """As ``Pregel.copy`` (``with_config`` uses it), keeping the governance."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.__dict__.update(update or {})
        return clone

    # invoke/ainvoke run on stream/astream. They open the invocation themselves and mark
    # it in the config, and the stream call they make takes it as its own instead of
    # wrapping LangGraph's stream in one more generator, which every chunk and every
    # suspension of the run would pass through.
    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        with _Invocation(self, config) as config:
            return super().invoke(input, config, **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        with _Invocation(self, config) as config:
            return await super().ainvoke(input, config, **kwargs)

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        if _Invocation.take(self, config):
            return super().stream(input, config, **kwargs)
        return self._stream(input, config, **kwargs)

    def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        if _Invocation.take(self, config):
            return super().astream(input, config, **kwargs)
        return self._astream(input, config, **kwargs)

    def _stream(self, input: Any, config: RunnableConfig | None, **kwargs: Any) -> Iterator[Any]:
        with _Invocation(self, config) as config:
            yield from super().stream(input, config, **kwargs)

    async def _astream(
        self, input: Any, config: RunnableConfig | None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        with _Invocation(self, config) as config:
            # A consumer that stops early closes this generator: close LangGraph's too,
            # now (``async for`` alone leaves it to the garbage collector), so that its
            # running tasks are cancelled before the invocation releases their leases.
            stream = super().astream(input, config, **kwargs)
            assert isinstance(stream, AsyncGenerator)  # Pregel.astream is an async generator
            async with contextlib.aclosing(stream) as chunks:
                async for chunk in chunks:
                    yield chunk


class _Invocation:
    """One invocation of a governed graph: a frame, inside ``governor.run``; entered, the
    config that carries the frame to the nodes (and this invocation, under
    ``_INVOKED``, to the stream call of its ``invoke``/``ainvoke``: ``take``)."""

    __slots__ = ("config", "frame", "graph", "run", "streaming")

    def __init__(self, graph: GovernedGraph, config: RunnableConfig | None) -> None:
        self.graph = graph
        self.streaming = False
        self.frame, self.config = open_frame(graph._governance, config)
        self.config["configurable"][_INVOKED] = self
        self.run = graph.governor.run(graph.get_name())

    @staticmethod
    def take(graph: GovernedGraph, config: RunnableConfig | None) -> bool:
        """Whether this stream call of ``graph`` is the one its own ``invoke`` opened the
        invocation for (once: the nodes inherit the config, and a graph they run opens
        its own)."""
        invocation = ((config or {}).get("configurable") or {}).get(_INVOKED)
        if not isinstance(invocation, _Invocation) or invocation.graph is not graph:
            return False
        if invocation.streaming:
            return False
        invocation.streaming = True
        return True

    def __enter__(self) -> RunnableConfig:
        self.run.__enter__()
        return self.config

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A caller that stops reading (GeneratorExit) ends the run, but is not its failure;
        # nor is an interrupt that a subgraph passes up to its parent graph.
        error = None if isinstance(exc, GeneratorExit) else failure(exc)
        try:
            self.frame.close()
        finally:
            # A stream dropped unfinished is closed wherever it is collected, maybe in
            # another context than the run's: resetting its context variable fails there,
            # and there is nothing of it to reset.
            with contextlib.suppress(ValueError):
                self.run.__exit__(None if error is None else type(error), error, None)
