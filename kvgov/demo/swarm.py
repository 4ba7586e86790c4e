"""The demo's swarm: a LangGraph planner that fans out to workers whose contexts grow.

The planner makes a real model call to plan, sends one task to each worker (``Send``),
and makes a last call over their reports. A worker is a ReAct loop (agent node, then a
``ToolNode``, then the agent again) for ``turns`` rounds. The tiny random model cannot
call tools, so a script stands in for that part of a model: each agent turn is a real
generation on the engine, and the script then attaches the tool call the turn makes.
The tools return realistic outputs of 2,000-4,400 tokens from ``policies.build_corpus``
(test logs, JSON responses, listings, service logs, web pages).

A worker that runs out of context (``CeilingExceeded``, what a server's context-length
or out-of-memory error is to an agent stack) fails alone: its report says so and the
swarm carries on, so the demo can count failures.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Send
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from governor import AgentSpec, BackendError, CeilingExceeded, Governor
from integrations.langchain import to_chat
from integrations.langgraph import current_lease, govern
from policies import build_corpus

__all__ = ["SYSTEM_PROMPT", "Swarm", "SwarmSpec", "build_swarm"]

SYSTEM_PROMPT = (
    "You are a worker agent in a software-maintenance swarm. You investigate one task "
    "with the tools you have: run commands, fetch pages, call APIs. Each tool result is "
    "evidence; keep the error lines, the failing test names and the identifiers you were "
    "asked about. When you have enough, answer with a short report: what fails, where, "
    "and the most likely cause. Be terse; do not repeat tool output back."
)
_MIN_TOKENS, _MAX_TOKENS = 2_000, 4_400  # the corpus's smallest outputs


@dataclass(frozen=True, slots=True, kw_only=True)
class SwarmSpec:
    num_workers: int
    turns: int
    reply_tokens: int
    planner: AgentSpec
    worker: AgentSpec
    system_in_messages: bool  # False: the system prompt is a registered shared prefix


class SwarmState(TypedDict):
    task: str
    reports: Annotated[list[str], operator.add]
    failures: Annotated[list[str], operator.add]


class WorkerState(MessagesState):
    index: int
    turn: int


class _Arguments(BaseModel):
    """What the corpus's tools take: a shell command, or a URL to request or fetch."""

    command: str | None = None
    url: str | None = None


class _ScriptedTool(BaseTool):
    """Returns the corpus output recorded for the exact arguments it is called with."""

    description: str = "Runs the command, request or fetch its arguments describe."
    args_schema: type[BaseModel] = _Arguments
    outputs: Mapping[str, str] = Field(default_factory=dict)

    def _run(self, **arguments: Any) -> str:
        given = {name: value for name, value in arguments.items() if value is not None}
        return self.outputs[_key(given)]


@dataclass(frozen=True, slots=True)
class Swarm:
    graph: Any  # a GovernedGraph
    spec: SwarmSpec

    def inputs(self) -> dict[str, Any]:
        return {"task": "Find out why the nightly build is red.", "reports": [], "failures": []}


def build_swarm(
    governor: Governor, spec: SwarmSpec, *, on_call: Callable[[], None] = lambda: None
) -> Swarm:
    """The governed swarm graph; ``on_call`` runs after every model call (progress)."""
    scripts, tools = _scripts(spec.num_workers, spec.turns)
    worker_graph = govern(
        _worker_graph(governor, spec, scripts, tools, on_call), governor, {"agent": spec.worker}
    )

    async def plan(state: SwarmState) -> dict[str, Any]:
        lease = current_lease()
        assert lease is not None, "the planner node runs in its lease"
        ask = [
            {
                "role": "user",
                "content": f"Split this into {spec.num_workers} tasks: {state['task']}",
            }
        ]
        await governor.acomplete(lease, ask, max_tokens=spec.reply_tokens)
        on_call()
        return {}

    def fan_out(state: SwarmState) -> list[Send]:
        return [Send("worker", {"index": i}) for i in range(spec.num_workers)]

    async def worker(state: Mapping[str, Any]) -> dict[str, Any]:
        index = int(state["index"])
        first: list[BaseMessage] = [
            HumanMessage(f"Task {index}: {scripts[index][0].tool_name} findings, then report.")
        ]
        if spec.system_in_messages:
            first.insert(0, SystemMessage(SYSTEM_PROMPT))
        try:
            done = await worker_graph.ainvoke({"messages": first, "index": index, "turn": 0})
        except (CeilingExceeded, BackendError) as exc:
            return {"failures": [f"worker {index}: {type(exc).__name__}"]}
        return {"reports": [f"worker {index}: {done['messages'][-1].content[:80]}"]}

    async def synthesize(state: SwarmState) -> dict[str, Any]:
        lease = current_lease()
        assert lease is not None
        reports = "\n".join(state["reports"]) or "(no reports)"
        ask = [{"role": "user", "content": f"Merge these reports:\n{reports}"}]
        await governor.acomplete(lease, ask, max_tokens=spec.reply_tokens)
        on_call()
        return {}

    builder = StateGraph(SwarmState)
    builder.add_node("planner", plan)
    builder.add_node("worker", worker)  # type: ignore[type-var]  # takes a Send payload, no schema
    builder.add_node("synthesize", synthesize)
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", fan_out, ["worker"])
    builder.add_edge("worker", "synthesize")
    builder.add_edge("synthesize", END)
    agents = {"planner": spec.planner, "worker": spec.worker, "synthesize": spec.planner}
    topology = [("planner", "worker", spec.num_workers)]
    return Swarm(govern(builder, governor, agents, topology=topology), spec)


def _worker_graph(
    governor: Governor,
    spec: SwarmSpec,
    scripts: Sequence[Sequence[Any]],
    tools: Sequence[BaseTool],
    on_call: Callable[[], None],
) -> StateGraph:
    async def agent(state: WorkerState) -> dict[str, Any]:
        lease = current_lease()
        assert lease is not None, "the agent node runs in its worker's lease"
        messages = [to_chat(m) for m in state["messages"]]
        result = await governor.acomplete(lease, messages, max_tokens=spec.reply_tokens)
        on_call()
        turn = state["turn"]
        calls = []
        if turn < spec.turns:  # the script decides the tool call a real model would make
            document = scripts[state["index"]][turn]
            arguments = dict(document.arguments)
            calls = [
                {
                    "name": document.tool_name,
                    "args": arguments,
                    "id": f"call-{state['index']}-{turn}",
                    "type": "tool_call",
                }
            ]
        reply = AIMessage(content=result.text, tool_calls=calls)
        return {"messages": [reply], "turn": turn + 1}

    def route(state: WorkerState) -> str:
        last: BaseMessage = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(WorkerState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(list(tools)))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


def _scripts(num_workers: int, turns: int) -> tuple[list[list[Any]], list[BaseTool]]:
    """Each worker's tool outputs, turn by turn, and one scripted tool per tool name."""
    corpus = [d for d in build_corpus(num_documents=50) if _fits(d.text)]
    scripts = [
        [corpus[(i * 7 + t * 3) % len(corpus)] for t in range(turns)] for i in range(num_workers)
    ]
    outputs: dict[str, dict[str, str]] = {}
    for document in corpus:
        outputs.setdefault(document.tool_name, {})[_key(document.arguments)] = document.text
    tools: list[BaseTool] = [
        _ScriptedTool(name=name, outputs=texts) for name, texts in sorted(outputs.items())
    ]
    return scripts, tools


def _fits(text: str) -> bool:
    # About 3.6 characters per cl100k token in this corpus: a cheap size filter.
    return _MIN_TOKENS * 3 <= len(text) <= _MAX_TOKENS * 3.6


def _key(arguments: Mapping[str, Any]) -> str:
    return json.dumps(dict(arguments), sort_keys=True)
