"""Graphs, a fake chat model and checks shared by the tests of
``integrations.langgraph.govern`` (``test_langgraph.py``, ``test_langgraph_failures.py``).

The chat model is a fake (``ToolCallingModel``): no model small enough to run offline
calls tools, so it answers from the conversation instead, asking for ``rounds`` tool
calls and then giving its answer, and records the context each call was sent. The tool
returns about 20,000 characters. The governor runs on ``FakeBackend``.
"""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Send
from pydantic import Field
from typing_extensions import TypedDict

from governor import (
    AgentSpec,
    Governor,
    GovernorConfig,
    GovernorEvent,
    TokenCounter,
)
from governor.testing import FakeBackend
from integrations.langgraph import GovernedGraph, govern

NUM_WORKERS = 10
PLANNER = AgentSpec(name="planner", ceiling_tokens=1_000, max_fanout=3)
WORKER = AgentSpec(name="worker", ceiling_tokens=2_000, tool_output_tokens=200)


class ToolCallingModel(BaseChatModel):
    """Asks for ``rounds`` calls of ``search``, then answers; each call takes ``latency_s``."""

    rounds: int = 2
    latency_s: float = 0.002
    contexts: list[int] = Field(default_factory=list)  # tokens of every prompt it was sent

    @property
    def _llm_type(self) -> str:
        return "tool-calling-fake"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingModel:  # type: ignore[override]
        return self  # it knows its one tool already

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        self.contexts.append(TokenCounter().count_messages(messages))
        asked = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        done = sum(1 for m in messages[asked:] if isinstance(m, ToolMessage))
        if done < self.rounds:
            task = str(messages[asked].content)
            call = {"name": "search", "args": {"query": f"{task} #{done}"}, "id": f"{task}-{done}"}
            return AIMessage(content="", tool_calls=[call])
        return AIMessage(content=f"answer after {done} searches")

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        time.sleep(self.latency_s)
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        await asyncio.sleep(self.latency_s)
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])


@tool
def search(query: str) -> str:
    """Search the logs for ``query``: about 20,000 characters of matching lines."""
    return "".join(f"{query}: line {i} matched build step {i * 7} status ok\n" for i in range(400))


class WorkerState(MessagesState):
    reports: Annotated[list[list[BaseMessage]], operator.add]


class Outer(TypedDict):
    rounds: int
    reports: Annotated[list[list[BaseMessage]], operator.add]


def react_worker(
    governor: Governor,
    model: ToolCallingModel,
    *,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    **agents: AgentSpec,
) -> GovernedGraph:
    """A ReAct loop (model, then its tools, until it answers) that reports its messages."""

    def agent(state: WorkerState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: WorkerState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def report(state: WorkerState) -> dict[str, Any]:
        return {"reports": [list(state["messages"])]}

    builder = StateGraph(WorkerState)
    builder.add_node("agent", sync_and_async(agent, aagent))
    builder.add_node("tools", ToolNode([search]))
    builder.add_node("report", report)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: "report"})
    builder.add_edge("tools", "agent")
    builder.add_edge("report", END)
    return govern(builder.compile(checkpointer=checkpointer), governor, agents)


def sync_and_async(sync: Callable[..., Any], async_: Callable[..., Any]) -> Any:
    """A node LangGraph runs as ``sync`` under invoke and ``async_`` under ainvoke."""
    return RunnableLambda(sync, afunc=async_)


def planner_graph(governor: Governor, worker: Any, *, num_workers: int = NUM_WORKERS) -> Any:
    """The planner sends ``num_workers`` tasks, then runs once more to read the reports."""

    def planner(state: Outer) -> dict[str, Any]:
        return {"rounds": state["rounds"] + 1}

    def fan_out(state: Outer) -> list[Send] | str:
        if state["rounds"] > 1:
            return END
        return [
            Send("worker", {"messages": [HumanMessage(f"task {i}")]}) for i in range(num_workers)
        ]

    builder = StateGraph(Outer)
    builder.add_node("planner", planner)
    builder.add_node("worker", worker)
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", fan_out)
    builder.add_edge("worker", "planner")
    return govern(builder, governor, {"planner": PLANNER, "worker": WORKER})


class Recorder:
    """Governor events, and the most leases of one agent admitted and not yet released."""

    def __init__(self, governor: Governor, agent: str = "worker") -> None:
        self.agent = agent
        self.events: list[GovernorEvent] = []
        self.peak = 0
        self._live: set[str | None] = set()
        self._lock = threading.Lock()
        governor.subscribe(self)

    def __call__(self, event: GovernorEvent) -> None:
        with self._lock:
            self.events.append(event)
            if event.agent != self.agent:
                return
            if event.kind == "admitted":
                self._live.add(event.lease_id)
                self.peak = max(self.peak, len(self._live))
            elif event.kind == "released":
                self._live.discard(event.lease_id)

    def kinds(self, agent: str) -> list[str]:
        return [e.kind for e in self.events if e.agent == agent]


def make_governor(**config: Any) -> Governor:
    return Governor(FakeBackend(num_blocks=4_096), config=GovernorConfig(**config))


def assert_no_leaks(governor: Governor) -> None:
    assert governor.admission.counts()[:2] == (0, 0)
    assert governor.fanout_limiter.num_parents == 0
    assert governor.backend.metrics().num_blocks_in_use == 0


def run(graph: Any, inputs: dict[str, Any], mode: str) -> Any:
    if mode == "invoke":
        return graph.invoke(inputs)
    if mode == "ainvoke":
        return asyncio.run(graph.ainvoke(inputs))
    if mode == "stream":
        chunks = list(graph.stream(inputs, stream_mode="values"))
        assert len(chunks) > 2
        return chunks[-1]

    async def astream() -> Any:
        return [chunk async for chunk in graph.astream(inputs, stream_mode="values")]

    chunks = asyncio.run(astream())
    assert len(chunks) > 2
    return chunks[-1]
