"""A LangGraph planner fanning out to workers with ``Send``, run within the governor.

What it shows: ``govern(graph, governor, agents={...})`` runs each node named in
``agents`` inside a lease of its agent. Before the run, ``governor.check_topology`` says
whether the planner and its workers fit the KV budget (``govern`` runs the same check and
refuses a graph that cannot fit). During the run each ``Send`` gets a child lease of the
planner's, at most ``max_fanout`` at once, while the planner is parked. The nodes'
model is ``GovernedChatModel``: real generations on the bundled engine (``LocalBackend``,
``tiny-random``: random weights, so the text is noise), inside the node's lease.

    python examples/planner_workers_langgraph.py          # 8 workers, 32-token replies
    python examples/planner_workers_langgraph.py --fast   # 5 workers, 4-token replies
"""

from __future__ import annotations

import argparse
import asyncio
import operator
from typing import Annotated, Any

from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

from backends import LocalBackend
from governor import AgentSpec, Governor, GovernorEvent
from integrations import GovernedChatModel, govern


class PlanState(TypedDict):
    task: str
    subtasks: list[str]
    reports: Annotated[list[str], operator.add]  # each worker appends its own


def build(governor: Governor, num_workers: int, reply_tokens: int) -> StateGraph:
    planner_model = GovernedChatModel(governor, agent="planner", max_tokens=reply_tokens)
    worker_model = GovernedChatModel(governor, agent="worker", max_tokens=reply_tokens)

    async def plan(state: PlanState) -> dict[str, Any]:
        await planner_model.ainvoke([HumanMessage(f"Split into steps: {state['task']}")])
        # The random model's plan is noise, so the steps are fixed here.
        steps = [f"check module {i} for the failing import" for i in range(num_workers)]
        return {"subtasks": steps}

    def fan_out(state: PlanState) -> list[Send]:  # annotated: govern infers the fan-out
        return [Send("worker", {"subtask": subtask}) for subtask in state["subtasks"]]

    async def work(state: dict[str, Any]) -> dict[str, Any]:
        reply = await worker_model.ainvoke([HumanMessage(state["subtask"])])
        return {"reports": [f"{state['subtask']}: {reply.content!s:.30}"]}

    async def merge(state: PlanState) -> dict[str, Any]:
        reports = "\n".join(state["reports"])
        await planner_model.ainvoke([HumanMessage(f"Merge these reports:\n{reports}")])
        return {}

    graph = StateGraph(PlanState)
    graph.add_node("planner", plan)
    graph.add_node("worker", work)
    graph.add_node("merge", merge)
    graph.add_edge(START, "planner")
    graph.add_conditional_edges("planner", fan_out, ["worker"])
    graph.add_edge("worker", "merge")
    graph.add_edge("merge", END)
    return graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="5 workers, 4-token replies")
    args = parser.parse_args()
    num_workers, reply_tokens = (5, 4) if args.fast else (8, 32)

    backend = LocalBackend(config={"num_blocks": 128})  # 2,048 tokens of KV in all
    planner = AgentSpec(name="planner", ceiling_tokens=512, max_fanout=3)
    worker = AgentSpec(name="worker", ceiling_tokens=512)
    governor = Governor(backend, agents=[planner, worker])  # guaranteed admission
    # The governor parks the planner while its workers run: govern() checks the "guaranteed,
    # parking" row and raises TopologyError when it does not fit.
    print(governor.check_topology(planner="planner", worker="worker", num_workers=num_workers))

    active: set[str] = set()  # worker leases admitted and not parked or released
    most = 0

    def on_event(event: GovernorEvent) -> None:
        nonlocal most
        if event.agent != "worker" or event.lease_id is None:
            return
        if event.kind in ("admitted", "resumed"):
            active.add(event.lease_id)
            most = max(most, len(active))
        elif event.kind in ("parked", "released"):
            active.discard(event.lease_id)

    governor.subscribe(on_event)
    agents = {"planner": planner, "worker": worker, "merge": planner}
    app = govern(build(governor, num_workers, reply_tokens), governor, agents=agents)
    with backend:  # closes the engine at the end
        result = asyncio.run(app.ainvoke({"task": "Find why the nightly build fails."}))

    print(f"\n{len(result['reports'])} reports (the tiny random model's text is noise):")
    for report in result["reports"]:
        print(f"  {report}")
    print(f"most workers running at once: {most} (the planner's max_fanout: {planner.max_fanout})")


if __name__ == "__main__":
    main()
