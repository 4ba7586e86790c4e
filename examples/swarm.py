"""A planner fans out to workers whose contexts grow with tool output, in plain governor code.

What it shows, with no LangGraph: the bundled engine (``LocalBackend``, the ``tiny-random``
preset: random weights, real compute) on a small KV budget; a ``Governor`` in overcommit
mode that summarizes each tool result (``ExtractiveSummarizer``) and folds the oldest turns
into a summary at the ceiling (``SummarizeOldest``); a system prompt registered once and
shared by every worker; a planner lease fanning out to workers (``governor.fanout``), at
most ``max_fanout`` at once while the planner is parked. Each worker turn is a real
generation, then a tool call (``governor.tool_call``: the lease idles, its KV held) whose
result, a realistic log or API response from ``policies.build_corpus``, is reduced before
it is appended.

    python examples/swarm.py            # 8 workers, 6 turns each
    python examples/swarm.py --fast     # 3 workers, 3 turns: a few seconds on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from typing import Any

from backends import LocalBackend
from governor import (
    AdmissionMode,
    AgentSpec,
    ChildContext,
    Governor,
    GovernorConfig,
    GovernorEvent,
    Policies,
)
from policies import ExtractiveSummarizer, SummarizeOldest, build_corpus

SYSTEM_PROMPT = (
    "You are a worker in a software-maintenance swarm. Investigate one task with your "
    "tools; keep error lines, failing test names and the identifiers you were asked about. "
    "Answer with a short report: what fails, where, and the most likely cause."
)
# The tiny random model cannot call tools, so the tool calls are scripted.
DOCUMENTS = [d for d in build_corpus(num_documents=24) if len(d.text) < 40_000]


async def work(governor: Governor, child: ChildContext, index: int, turns: int) -> None:
    async with child as lease:  # waits for a fan-out slot and for admission
        history: list[dict[str, Any]] = [
            {"role": "user", "content": f"Task {index}: find out why the nightly build fails."}
        ]
        for turn in range(turns):
            reply = await governor.acomplete(lease, history, max_tokens=8)
            document = DOCUMENTS[(index * 5 + turn * 3) % len(DOCUMENTS)]
            function = {"name": document.tool_name, "arguments": dict(document.arguments)}
            request = {"id": f"call-{index}-{turn}", "type": "function", "function": function}
            history.append({"role": "assistant", "content": reply.text, "tool_calls": [request]})
            async with governor.tool_call(lease, document.tool_name, document.arguments) as call:
                await asyncio.sleep(0.1)  # a real tool runs here, while the lease idles
                output = document.text
            reduced = call.reduce(output)  # at most the worker's tool_output_tokens
            history.append({"role": "tool", "tool_call_id": request["id"], "content": reduced.text})


async def swarm(governor: Governor, num_workers: int, turns: int) -> None:
    async with governor.run("nightly-build"), governor.lease("planner") as plan:
        ask = [{"role": "user", "content": f"Split the task into {num_workers} parts."}]
        await governor.acomplete(plan, ask, max_tokens=8)
        children = governor.fanout(plan, "worker", num_workers)
        await asyncio.gather(*(work(governor, c, i, turns) for i, c in enumerate(children)))
        merge = [*ask, {"role": "user", "content": "Merge the workers' reports."}]
        await governor.acomplete(plan, merge, max_tokens=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="3 workers, 3 turns")
    args = parser.parse_args()
    num_workers, turns = (3, 3) if args.fast else (8, 6)
    print("The tool calls are scripted: the tiny random model cannot call tools.")

    backend = LocalBackend(config={"num_blocks": 128})  # 2,048 tokens of KV in all
    planner = AgentSpec(name="planner", ceiling_tokens=384, max_fanout=3)
    worker = AgentSpec(name="worker", ceiling_tokens=512, tool_output_tokens=192, prefix="system")
    # Admit on live use; park an agent 50 ms into a tool call; above 60% of the blocks in
    # use, move idle agents' held KV to host memory (restored before their next call).
    config = GovernorConfig(
        mode=AdmissionMode.OVERCOMMIT, park_after_s=0.05, pressure_watermark=0.6
    )
    governor = Governor(
        backend,
        config=config,
        agents=[planner, worker],
        policies=Policies(
            tool_output=ExtractiveSummarizer(backend.counter),
            ceiling=SummarizeOldest(summary_tokens=96),
        ),
    )
    governor.register_prefix("system", SYSTEM_PROMPT)  # pinned once, shared by every worker

    kinds: Counter[str] = Counter()
    names: dict[str, str] = {}  # lease id -> "worker 3"
    peak: Counter[str] = Counter()  # lease id -> most tokens in context after a call
    saved: dict[str, Counter[str]] = {"summarized": Counter(), "compacted": Counter()}

    def on_event(event: GovernorEvent) -> None:
        kinds[event.kind] += 1
        if event.lease_id is None:  # a run's event
            return
        names.setdefault(event.lease_id, f"{event.agent} {event.lease_id}")
        if event.kind == "call.finished":
            peak[event.lease_id] = max(peak[event.lease_id], event.attributes["tokens_in_context"])
        elif event.kind in saved:  # record: a ToolOutputReduction or a CompactionEvent
            saved[event.kind][event.lease_id] += event.record.tokens_saved

    governor.subscribe(on_event)
    with backend:  # closes the engine at the end
        asyncio.run(swarm(governor, num_workers, turns))

    for lease_id, name in names.items():
        summarized, compacted = saved["summarized"][lease_id], saved["compacted"][lease_id]
        print(
            f"{name:<10} peak context {peak[lease_id]:>4,} tokens; saved {summarized:>6,} "
            f"by summarizing tool output, {compacted:>5,} by compaction"
        )
    print("events:", ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items())))


if __name__ == "__main__":
    main()
