"""``kvgov bench integrations``: what governing a LangGraph graph costs.

- ``governed_over_plain``: wall time of one LangGraph run governed by ``govern`` over the
  same graph run plain (target <= 1.05). The run is 20 agents: a planner sends 20 tasks
  (``Send``), each to a ReAct worker subgraph (model, tools, model, tools, model) whose
  tool returns about 1,000 characters, within the worker's ``tool_output_tokens`` (what
  reducing a larger result costs is the tool-output policy's own figure). The model is
  a fake (``_FakeModel``): no offline model calls tools, and a fixed
  ``MODEL_LATENCY_S`` sleep per call (50 ms) stands in for one, so the ratio is a share
  of a run with model time in it. Real calls take far longer (seconds for a 9B model's
  turn on one consumer GPU), so this overstates the share; the note also gives the
  governor's absolute cost per run and per model call, which does not depend on it.
  ``ainvoke`` on one event loop: all 20 workers run at once in both (the planner's
  ``max_fanout`` is 20). The governor's backend is ``FakeBackend`` (the graph's nodes
  call their own model): only the governor's own work is timed. Plain and governed runs
  alternate, after a warm-up of each; the figure is the median, over 61 pairs, of a
  governed run's time over the plain run's beside it. One pair's ratio scatters by
  3-5% (standard deviation, in the note) on a shared 2-core host, so the median of 21
  pairs moved by about 1.3% from one invocation to the next, as much as the target's
  margin; 61 pairs bring that to about half.

What the governed run adds per run, measured on a 2-core CPU: the exact token counts of
every message (once per message; about 45 us per 1,000-character tool result, split by
``governor._ascii_count`` rather than tiktoken's own regex), ``governor.tool_call``
around each tools node (a deadline armed and cancelled), and the leases, fan-out slots
and runs: about 15% more CPU than the plain run (callgrind: 419M instructions per run
governed, 366M plain), half of it the counting.
"""

from __future__ import annotations

import asyncio
import gc
import operator
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Send
from typing_extensions import TypedDict

from governor import AgentSpec, Backend, FakeBackend, Governor
from integrations.langgraph import govern

__all__ = ["MODEL_LATENCY_S", "NUM_AGENTS", "AgentRun", "agent_run", "governed_run", "run"]

NUM_AGENTS = 20
MODEL_LATENCY_S = 0.05  # a fast model call; a 9B model's real turns take seconds
_BENCH = "integrations"
_TOOL_ROUNDS = 2
_PLANNER = AgentSpec(name="planner", ceiling_tokens=4_000, max_fanout=NUM_AGENTS)
_WORKER = AgentSpec(name="worker", ceiling_tokens=8_000, tool_output_tokens=500)


def run(*, quick: bool = False) -> Iterator[Mapping[str, object]]:
    yield _governed_over_plain(repeats=5 if quick else 61)


class _FakeModel(BaseChatModel):
    """Asks for ``_TOOL_ROUNDS`` tool calls, then answers; each call sleeps
    ``MODEL_LATENCY_S`` (a stand-in for a model: no offline model calls tools)."""

    @property
    def _llm_type(self) -> str:
        return "kvgov-bench-fake"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        time.sleep(MODEL_LATENCY_S)
        return ChatResult(generations=[ChatGeneration(message=_reply(messages))])

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        await asyncio.sleep(MODEL_LATENCY_S)
        return ChatResult(generations=[ChatGeneration(message=_reply(messages))])


def _reply(messages: list[BaseMessage]) -> AIMessage:
    done = sum(1 for message in messages if isinstance(message, ToolMessage))
    if done < _TOOL_ROUNDS:
        task = str(messages[0].content)
        call = {"name": "read_log", "args": {"task": task, "page": done}, "id": f"{task}/{done}"}
        return AIMessage(content="", tool_calls=[call])
    return AIMessage(content=f"{messages[0].content}: done")


@tool
async def read_log(task: str, page: int) -> str:
    """One page of a build log: about 1,000 characters."""
    return "".join(f"{task} page {page} step {i}: compiled module_{i}.py ok\n" for i in range(20))


class _Worker(MessagesState):
    reports: Annotated[list[str], operator.add]


class _Run(TypedDict):
    reports: Annotated[list[str], operator.add]


def _graphs(governor: Governor | None) -> Any:
    """The planner + 20 ReAct workers graph, governed by ``governor`` unless None."""
    model = _FakeModel()

    async def agent(state: _Worker) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def report(state: _Worker) -> dict[str, Any]:
        return {"reports": [str(state["messages"][-1].content)]}

    worker = StateGraph(_Worker)
    worker.add_node("agent", agent)
    worker.add_node("tools", ToolNode([read_log]))
    worker.add_node("report", report)
    worker.add_edge(START, "agent")
    worker.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: "report"})
    worker.add_edge("tools", "agent")
    worker.add_edge("report", END)

    def fan_out(state: _Run) -> list[Send]:
        return [
            Send("worker", {"messages": [HumanMessage(f"task {i}")]}) for i in range(NUM_AGENTS)
        ]

    planner = StateGraph(_Run)
    planner.add_node("planner", lambda state: {})
    planner.add_edge(START, "planner")
    planner.add_conditional_edges("planner", fan_out)
    planner.add_edge("worker", END)
    if governor is None:
        planner.add_node("worker", worker.compile())
        return planner.compile()
    planner.add_node("worker", govern(worker, governor, {"agent": _WORKER}))
    return govern(planner, governor, {"planner": _PLANNER, "worker": _WORKER})


@dataclass(frozen=True, slots=True)
class AgentRun:
    """The planner + ``NUM_AGENTS`` workers graph, governed by ``governor`` (None: plain)."""

    graph: Any
    governor: Governor | None

    async def once(self) -> tuple[float, float]:
        """One run's wall time and the CPU time this thread spent on it, in seconds."""
        gc.collect()
        started, cpu = time.perf_counter(), time.thread_time()
        result = await self.graph.ainvoke({"reports": []})
        elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu
        assert len(result["reports"]) == NUM_AGENTS
        return elapsed, cpu

    @property
    def leases_held(self) -> bool:
        """Whether the governor still holds a lease (waiting or active) after the runs."""
        return self.governor is not None and self.governor.admission.counts()[:2] != (0, 0)


def agent_run(backend: Backend | None) -> AgentRun:
    """The run, plain (``None``) or governed by a ``Governor`` on ``backend``: the same
    graph for every backend (``kvgov bench serve`` runs it on a local and a remote one)."""
    return AgentRun(_graphs(None), None) if backend is None else governed_run(Governor(backend))


def governed_run(governor: Governor) -> AgentRun:
    """The run governed by ``governor``, however it was built (``kvgov bench processes``
    gives it one on each store)."""
    return AgentRun(_graphs(governor), governor)


def _governed_over_plain(*, repeats: int) -> Mapping[str, object]:
    plain, governed = agent_run(None), agent_run(FakeBackend(num_blocks=16_384))

    async def measure() -> dict[str, list[tuple[float, float]]]:
        times: dict[str, list[tuple[float, float]]] = {"plain": [], "governed": []}
        runs: dict[str, Callable[[], Awaitable[tuple[float, float]]]] = {
            "plain": plain.once,
            "governed": governed.once,
        }
        for name in runs:  # warm-up: imports, caches, the tokenizer
            await runs[name]()
        for i in range(repeats):
            order = ("plain", "governed") if i % 2 == 0 else ("governed", "plain")
            for name in order:
                times[name].append(await runs[name]())
        return times

    times = asyncio.run(measure())
    plain_s, governed_s = (
        [wall for wall, _ in times["plain"]],
        [wall for wall, _ in times["governed"]],
    )
    cpu_ratio = statistics.median(
        g / p for (_, p), (_, g) in zip(times["plain"], times["governed"], strict=True)
    )
    leaked = governed.leases_held
    # Each governed run over the plain run beside it: the machine's drift (other jobs,
    # clock speed) moves both of a pair alike, so the median of the pairs' ratios is
    # steadier than the ratio of the two medians.
    ratios = [g / p for p, g in zip(plain_s, governed_s, strict=True)]
    ratio = statistics.median(ratios)
    extra_ms = statistics.median(g - p for p, g in zip(plain_s, governed_s, strict=True)) * 1e3
    num_calls = NUM_AGENTS * (_TOOL_ROUNDS + 1)
    governed_ms, plain_ms = statistics.median(governed_s) * 1e3, statistics.median(plain_s) * 1e3
    return {
        "bench": _BENCH,
        "metric": "governed_over_plain",
        "value": ratio,
        "unit": "x",
        "target": 1.05,
        "direction": "lower",
        "note": (
            f"median of {repeats} side-by-side pairs (one pair's ratio scatters by "
            f"{statistics.stdev(ratios) * 100:.1f}%, standard deviation); runs of "
            f"{governed_ms:.1f} ms governed "
            f"vs {plain_ms:.1f} ms plain (median {extra_ms:.1f} ms more per run, "
            f"{extra_ms / num_calls * 1e3:.0f} us per model call; the event loop's CPU time "
            f"{cpu_ratio:.2f}x plain's); planner + {NUM_AGENTS} "
            f"ReAct workers (3 model calls, 2 tool calls each) on a fake model that sleeps "
            f"{MODEL_LATENCY_S * 1e3:g} ms per call" + ("; leases left held" if leaked else "")
        ),
    }
