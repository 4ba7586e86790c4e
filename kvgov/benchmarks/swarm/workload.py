"""The swarm benchmark's workload: teams of coding agents, every prompt fixed up front.

A team is a planner and its workers, all starting with the team's system prompt. The
planner makes one call to plan, fans out to every worker at once, waits for all of
them, and makes one call over their reports. A worker runs ``turns`` rounds of model
call -> tool call -> tool output appended, then a last call to report: its context
grows every turn. Tool outputs come from the policies benchmark's corpus (test logs,
JSON responses, listings, service logs, web pages) and tool latencies from a lognormal
per tool: most well under a second, a few several seconds.

Every prompt is built here, before any run, so each policy sends exactly the same
requests: the tool outputs reduced to ``tool_output_tokens`` by kvgov's
``ExtractiveSummarizer`` and the history compacted at the ceiling by its
``SummarizeOldest`` (the same functions, applied once, for every policy). The tiny model
cannot choose tools, so the assistant turns in the history are the script's tool calls;
every model call is still a real generation on the engine, whose text is not fed back
(a numeric difference between two runs cannot change the next prompt).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from governor import TokenCounter
from policies import ExtractiveSummarizer, SummarizeOldest, build_corpus

__all__ = ["AgentScript", "SwarmWorkload", "Turn", "build_scripts", "peak_blocks"]

Message = dict[str, Any]

_SYSTEM = (
    "You are an agent of team {team} in a software-maintenance swarm. You investigate "
    "one task with the tools you have: run commands, fetch pages, call APIs. Each tool "
    "result is evidence; keep the error lines, the failing test names and the "
    "identifiers you were asked about. When you have enough, answer with a short report: "
    "what fails, where, and the most likely cause. Be terse; do not repeat tool output "
    "back. Team {team} owns the {area} services; their runbooks, dashboards and on-call "
    "notes apply to every task here. "
)
_AREAS = ("billing", "search", "ingest", "auth", "storage", "notifications")
# Each tool's median latency in seconds; the lognormal's sigma gives the heavy tail.
_TOOL_MEDIAN_S = {"fetch": 0.15, "http_request": 0.25, "run_command": 0.5}
_DEFAULT_MEDIAN_S = 0.3


@dataclass(frozen=True, slots=True, kw_only=True)
class SwarmWorkload:
    num_teams: int = 3
    workers_per_team: int = 2
    turns: int = 6
    reply_tokens: int = 8
    # None: tool outputs appended raw, and the history never compacted (it grows until
    # the engine refuses a prompt longer than the model's context): what an agent stack
    # without a tool-output reducer or a ceiling policy sends.
    tool_output_tokens: int | None = 1_024
    ceiling_tokens: int | None = 8_192
    system_repeats: int = 3  # the system prompt's length, in copies of its paragraph
    tool_sigma: float = 1.2  # of the lognormal: P(latency > 6 x median) is about 7%
    tool_scale: float = 1.0  # multiplies every latency (``--quick`` shortens them)
    team_gap_s: float = 0.5  # teams arrive this far apart
    seed: int = 0

    @property
    def num_agents(self) -> int:
        return self.num_teams * (1 + self.workers_per_team)


@dataclass(frozen=True, slots=True)
class Turn:
    """One model call, then (unless it is the agent's last) one tool call."""

    messages: tuple[Message, ...]
    tool: str | None  # the tool the turn ends in; None for the last turn
    tool_s: float  # how long that tool takes, drawn up front
    expected_s: float  # the tool's mean latency: what a runtime can know in advance
    reply_tokens: int | None = None  # the call's output tokens; None: the workload's


@dataclass(frozen=True, slots=True)
class AgentScript:
    name: str  # "t0-planner", "t0-w1"
    team: int
    planner: bool
    turns: tuple[Turn, ...]  # a planner's: plan (ends in the fan-out), then synthesize
    arrival_s: float  # a planner's arrival; a worker starts when its planner fans out
    tenant: str = ""  # whose agent it is, where a workload serves several tenants

    @property
    def system(self) -> Message:
        return self.turns[0].messages[0]


def build_scripts(workload: SwarmWorkload, counter: TokenCounter) -> tuple[AgentScript, ...]:
    """Every agent's prompts and tool latencies, planners first within each team."""
    rng = random.Random(f"kvgov-swarm:{workload.seed}")
    corpus = [d for d in build_corpus(num_documents=40, seed=workload.seed)]
    reduce = ExtractiveSummarizer(counter)
    compact = SummarizeOldest(reduce, summary_tokens=160)
    scripts: list[AgentScript] = []
    for team in range(workload.num_teams):
        system = {"role": "system", "content": _system(team, workload.system_repeats)}
        workers = []
        for w in range(workload.workers_per_team):
            history: list[Message] = [
                system,
                {
                    "role": "user",
                    "content": (
                        f"Task {team}.{w}: find out why the nightly build of the "
                        f"{_AREAS[team % len(_AREAS)]} services is red, then report."
                    ),
                },
            ]
            turns = []
            for t in range(workload.turns + 1):
                history = _fit(history, workload, counter, compact)
                if t == workload.turns:
                    turns.append(Turn(tuple(history), None, 0.0, 0.0))
                    break
                document = corpus[(team * 11 + w * 5 + t * 3) % len(corpus)]
                median = _TOOL_MEDIAN_S.get(document.tool_name, _DEFAULT_MEDIAN_S)
                median *= workload.tool_scale
                tool_s = median * math.exp(workload.tool_sigma * rng.gauss(0.0, 1.0))
                expected = median * math.exp(workload.tool_sigma**2 / 2)
                turns.append(Turn(tuple(history), document.tool_name, tool_s, expected))
                call = json.dumps({"tool": document.tool_name, **document.arguments})
                output = document.text
                if workload.tool_output_tokens is not None:
                    output = reduce.reduce(
                        document.text,
                        budget_tokens=workload.tool_output_tokens,
                        tool_name=document.tool_name,
                        arguments=document.arguments,
                    ).text
                history = [
                    *history,
                    {"role": "assistant", "content": f"Calling {call}"},
                    {"role": "user", "content": f"Tool result:\n{output}"},
                ]
            workers.append(AgentScript(f"t{team}-w{w}", team, False, tuple(turns), 0.0))
        ask = {
            "role": "user",
            "content": (
                f"Split the red nightly build of team {team} "
                f"into {workload.workers_per_team} tasks."
            ),
        }
        plan = (system, ask)
        reports = "\n".join(
            f"worker {w}: the failing step is in {_AREAS[(team + w) % len(_AREAS)]}, "
            f"see the tool results of task {team}.{w}"
            for w in range(workload.workers_per_team)
        )
        synthesize = (
            system,
            ask,
            {"role": "assistant", "content": "Fanned out."},
            {"role": "user", "content": f"Merge these reports:\n{reports}"},
        )
        expected_children = sum(t.tool_s for t in workers[0].turns) if workers else 0.0
        planner = AgentScript(
            f"t{team}-planner",
            team,
            True,
            (Turn(plan, "fanout", 0.0, expected_children), Turn(synthesize, None, 0.0, 0.0)),
            team * workload.team_gap_s,
        )
        scripts += [planner, *workers]
    return tuple(scripts)


def peak_blocks(
    scripts: Sequence[AgentScript], counter: TokenCounter, *, reply_tokens: int, block_size: int
) -> int:
    """Blocks every agent's peak context needs, all at once (nothing shared): 1.0 of the
    benchmark's KV budgets."""
    total = 0
    for script in scripts:
        peak = max(counter.count_messages(list(turn.messages)) for turn in script.turns)
        total += math.ceil((peak + reply_tokens) / block_size)
    return total


def _system(team: int, repeats: int) -> str:
    area = _AREAS[team % len(_AREAS)]
    return (_SYSTEM.format(team=team, area=area) * repeats).strip()


def _fit(
    history: list[Message], workload: SwarmWorkload, counter: TokenCounter, compact: Any
) -> list[Message]:
    """The history compacted by the ceiling policy when the next call would not fit (as it
    is, with no ceiling)."""
    if workload.ceiling_tokens is None:
        return history
    compacted, _ = compact.compact(
        history,
        ceiling_tokens=workload.ceiling_tokens,
        reserve_tokens=workload.reply_tokens,
        counter=counter,
    )
    return list(compacted)
