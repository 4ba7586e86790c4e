"""The open-loop swarm workload: teams arriving as a Poisson process, of tenants of
different sizes, whose agents make 20-40 calls with heavy-tailed tools between them.

A team is a planner and its workers, all starting with the team's system prompt. Team
arrivals are a Poisson process (exponential gaps at ``rate_per_min``) over
``[0, duration_s)``; each team's tenant is drawn by the tenants' weights. The planner makes
one call to plan, fans out to its workers at once, waits for all of them, and makes one
call over their reports. A worker makes its tenant's number of tool calls (drawn per
worker), each a model call followed by a tool whose latency is drawn from that tool's
lognormal, then a last call to report. Its history grows every turn by the call's own
text (the engine's generated text is not fed back, so a numeric difference between two
runs cannot change the next prompt) and the tool's output, cut from the policies
benchmark's corpus to a drawn size, reduced by kvgov's ``ExtractiveSummarizer`` when
``tool_output_tokens`` is set and compacted at ``ceiling_tokens`` by its
``SummarizeOldest`` (``context.kvgov_compaction``: a summary of up to ``summary_share``
of the ceiling, a quarter unless set), which reads the history as tool calls and their
results (``chat_text``), as kvgov's ceiling policy reads a LangGraph agent's: the same
functions, applied once, before any run, so every policy sends exactly the same requests.
With ``facts``, each raw tool output first gets facts planted in it (``facts.plant``,
from draws of their own; ``build_planted`` says which).
A reply quotes its last result, so planted lines can change later draws: a workload with
facts is compared with itself under other context handlings, never with the workload
without them.

Invariants: ``build`` is a function of the workload and the counter's tokenizer (the same
seed gives equal scripts); a team's planner comes before its workers; with a ceiling, no
call's prompt and reply pass it. ``prompts`` gives ``tokenizer.encode_chat``'s ids.

Errors: ``OpenLoopWorkloadError`` (a ``ValueError``) for a workload or tenant that
cannot be built; its message says which field to change.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.tokenizer import Tokenizer
from governor import CeilingExceeded, TokenCounter
from kvgov.benchmarks.context import SUMMARY_SHARE, kvgov_compaction
from kvgov.benchmarks.context_workload import Fact
from kvgov.benchmarks.openloop import chat_text
from kvgov.benchmarks.openloop import facts as planting
from kvgov.benchmarks.openloop.chat_ids import LineIds
from kvgov.benchmarks.swarm.workload import AgentScript, Message, Turn
from policies import ExtractiveSummarizer, SummarizeOldest, build_corpus
from policies.benchmarks.corpus import Category

__all__ = [
    "CPU",
    "MIXES",
    "TENANTS",
    "TWIN",
    "OpenLoopWorkload",
    "OpenLoopWorkloadError",
    "Tenant",
    "Tool",
    "arrivals",
    "build",
    "build_planted",
    "counter_for",
    "describe",
    "prompts",
]

_MIN_LATENCY_S = 0.001
_MAX_LATENCY_S = 30.0
# A ceiling must hold the system prompt, the task, one reply and room to compact into.
_MIN_ROOM_TOKENS = 512
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_CATEGORIES = frozenset(c.value for c in Category)


class OpenLoopWorkloadError(ValueError):
    """A workload or tenant that cannot be built; the message says what to change."""


def _positive(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _count(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _span(value: object, least: int) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and all(_count(v, least) for v in value)
        and value[0] <= value[1]
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    """One tool of a mix: its latency a lognormal (``median_s``, ``sigma``) clipped to
    [1 ms, 30 s], its output ``min_tokens``-``max_tokens`` tokens (uniform) cut from the
    corpus documents of ``category``, chosen with ``weight`` among its mix's tools."""

    name: str
    median_s: float
    sigma: float
    min_tokens: int
    max_tokens: int
    category: str  # a corpus ``Category`` value: "test_log", "json_api", ...
    weight: float

    def __post_init__(self) -> None:
        if not (_positive(self.median_s) and _positive(self.sigma)):
            raise OpenLoopWorkloadError(
                f"tool {self.name}: median_s and sigma of its lognormal latency must be "
                f"finite numbers > 0, got {self.median_s!r} and {self.sigma!r}"
            )
        if not _span((self.min_tokens, self.max_tokens), 1):
            raise OpenLoopWorkloadError(
                f"tool {self.name}: its output is min_tokens-max_tokens tokens, ints with "
                f"1 <= min_tokens <= max_tokens, got {self.min_tokens!r}-{self.max_tokens!r}"
            )
        if self.category not in _CATEGORIES:
            raise OpenLoopWorkloadError(
                f"tool {self.name}: category {self.category!r} names no corpus category; "
                f"use one of {sorted(_CATEGORIES)}"
            )
        if not _positive(self.weight):
            raise OpenLoopWorkloadError(
                f"tool {self.name}: weight is its share of its mix's calls, a finite number "
                f"> 0, got {self.weight!r}"
            )

    @property
    def mean_s(self) -> float:
        """The clipped lognormal's mean: what a runtime can know of the tool in advance."""
        mu, s = math.log(self.median_s), self.sigma
        lo, hi = math.log(_MIN_LATENCY_S), math.log(_MAX_LATENCY_S)

        def phi(x: float) -> float:
            return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))

        inside = math.exp(mu + s * s / 2) * (
            phi((hi - mu - s * s) / s) - phi((lo - mu - s * s) / s)
        )
        below = _MIN_LATENCY_S * phi((lo - mu) / s)
        above = _MAX_LATENCY_S * (1.0 - phi((hi - mu) / s))
        return below + inside + above

    def draw_s(self, rng: random.Random) -> float:
        latency = self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        return min(_MAX_LATENCY_S, max(_MIN_LATENCY_S, latency))


# SWE-bench agent trajectories (SWE-agent, Yang et al. 2024; OpenHands, Wang et al. 2024):
# most actions open or read a file (tens of ms, a 100-line window to a whole module:
# 400-2,500 tokens) or search the repository (grep/find: 50-500 ms); edits take 10-50 ms
# and echo a short window; running the test suite takes 2-30 s and prints 300-4,000
# tokens of log, a reproduction script 0.5-5 s. The corpus has no source files: a file
# read is cut from documentation and JSON fixtures, an edit's echoed window from a stack
# trace's frames (code lines with their paths), a search from directory listings.
_SWE = (
    Tool(
        name="open_file",
        median_s=0.03,
        sigma=0.5,
        min_tokens=400,
        max_tokens=2_500,
        category="web_page",
        weight=0.30,
    ),
    Tool(
        name="search",
        median_s=0.16,
        sigma=0.6,
        min_tokens=150,
        max_tokens=1_200,
        category="directory_listing",
        weight=0.25,
    ),
    Tool(
        name="edit",
        median_s=0.022,
        sigma=0.4,
        min_tokens=40,
        max_tokens=250,
        category="stack_trace",
        weight=0.20,
    ),
    Tool(
        name="run_tests",
        median_s=8.0,
        sigma=0.6,
        min_tokens=300,
        max_tokens=4_000,
        category="test_log",
        weight=0.15,
    ),
    Tool(
        name="run_repro",
        median_s=1.6,
        sigma=0.6,
        min_tokens=200,
        max_tokens=1_500,
        category="stack_trace",
        weight=0.10,
    ),
)
# BFCL multi-turn (the Berkeley Function-Calling Leaderboard, v3's multi-turn set):
# stateful API calls against simulated services, 50-800 ms each, returning JSON of
# 100-600 tokens; reads outnumber writes.
_BFCL = (
    Tool(
        name="api_get",
        median_s=0.2,
        sigma=0.6,
        min_tokens=100,
        max_tokens=600,
        category="json_api",
        weight=0.65,
    ),
    Tool(
        name="api_post",
        median_s=0.3,
        sigma=0.5,
        min_tokens=100,
        max_tokens=400,
        category="json_api",
        weight=0.35,
    ),
)
# A research agent's search and fetch (deep-research and browsing agents, WebArena-like
# tools): a web search returns a JSON list of results in about a second, a page fetch
# takes 0.5-5 s and returns 800-3,000 tokens of text. Its own mix because its outputs
# are long and its tools slow without the test suite's 30 s tail: a third shape of
# context growth and wait.
_RESEARCH = (
    Tool(
        name="web_search",
        median_s=0.8,
        sigma=0.5,
        min_tokens=300,
        max_tokens=1_200,
        category="json_api",
        weight=0.4,
    ),
    Tool(
        name="fetch_page",
        median_s=1.5,
        sigma=0.7,
        min_tokens=800,
        max_tokens=3_000,
        category="web_page",
        weight=0.6,
    ),
)
MIXES: Mapping[str, tuple[Tool, ...]] = {"swe": _SWE, "bfcl": _BFCL, "research": _RESEARCH}


@dataclass(frozen=True, slots=True, kw_only=True)
class Tenant:
    """One tenant's teams: a planner and ``workers_per_team`` workers, each worker making
    ``turns`` tool calls (drawn uniformly per worker, inclusive) from the ``mix``; its
    teams are ``weight`` of all arrivals (weights are relative)."""

    name: str
    weight: float
    workers_per_team: int
    turns: tuple[int, int]
    mix: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise OpenLoopWorkloadError(
                f"a tenant's name is lower-case letters, digits and _ (it names its agents, "
                f"'<tenant>-t<k>-w<j>'), got {self.name!r}"
            )
        if not _positive(self.weight):
            raise OpenLoopWorkloadError(
                f"tenant {self.name}: weight is its share of team arrivals, a finite number "
                f"> 0, got {self.weight!r}"
            )
        if not _count(self.workers_per_team, 1):
            raise OpenLoopWorkloadError(
                f"tenant {self.name}: workers_per_team must be an int >= 1 (a planner fans "
                f"out to at least one worker), got {self.workers_per_team!r}"
            )
        if not _span(self.turns, 1):
            raise OpenLoopWorkloadError(
                f"tenant {self.name}: turns is (fewest, most) tool calls of a worker, ints "
                f"with 1 <= fewest <= most, got {self.turns!r}"
            )
        if self.mix not in MIXES:
            raise OpenLoopWorkloadError(
                f"tenant {self.name}: mix {self.mix!r} is not one of {sorted(MIXES)}"
            )


# Three sizes of team. swe: SWE-bench issue solving, a planner and 3 workers (one per
# suspect area) of 20-40 steps, the median agent of real coding sessions being about 36
# turns; half the traffic. bfcl: a customer-facing function-calling assistant, a planner
# and 1 worker of 20-30 short API calls. research: a planner and 5 workers searching and
# reading in parallel, 20-30 steps: the widest fan-out and the rarest.
TENANTS = (
    Tenant(name="swe", weight=0.5, workers_per_team=3, turns=(20, 40), mix="swe"),
    Tenant(name="bfcl", weight=0.3, workers_per_team=1, turns=(20, 30), mix="bfcl"),
    Tenant(name="research", weight=0.2, workers_per_team=5, turns=(20, 30), mix="research"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenLoopWorkload:
    """Teams arriving at ``rate_per_min`` (Poisson) over ``[0, duration_s)``, at least
    one; every call's reply ``reply_tokens`` tokens (drawn uniformly per call, inclusive);
    tool outputs reduced to ``tool_output_tokens`` (None: appended raw) and histories
    compacted at ``ceiling_tokens`` (None: never) with a running summary of up to
    ``summary_share`` of it, each compaction to ``compact_to`` of it where it can
    (``SummarizeOldest``'s); a team's system prompt about ``system_tokens`` long; with
    ``facts``, facts planted in every raw tool output."""

    rate_per_min: float
    duration_s: float
    tenants: tuple[Tenant, ...] = TENANTS
    reply_tokens: tuple[int, int] = (100, 300)
    tool_output_tokens: int | None = 2_048
    ceiling_tokens: int | None = 16_000
    summary_share: float = SUMMARY_SHARE
    compact_to: float = 1.0
    system_tokens: int = 1_500
    seed: int = 0
    facts: bool = False

    def __post_init__(self) -> None:
        if not _positive(self.rate_per_min):
            raise OpenLoopWorkloadError(
                f"rate_per_min is the mean of team arrivals a minute, a finite number > 0, "
                f"got {self.rate_per_min!r}"
            )
        if not _positive(self.duration_s):
            raise OpenLoopWorkloadError(
                f"duration_s is how long teams arrive, a finite number of seconds > 0, got "
                f"{self.duration_s!r}"
            )
        tenants = self.tenants
        if not isinstance(tenants, tuple) or not tenants:
            raise OpenLoopWorkloadError(
                f"tenants must be a non-empty tuple of Tenant, got {tenants!r}"
            )
        if not all(isinstance(t, Tenant) for t in tenants):
            raise OpenLoopWorkloadError("tenants must hold only Tenant objects")
        names = [t.name for t in tenants]
        if len(set(names)) != len(names):
            raise OpenLoopWorkloadError(f"tenant names must be unique, got {names}")
        if not _span(self.reply_tokens, 1):
            raise OpenLoopWorkloadError(
                f"reply_tokens is (fewest, most) tokens a call generates, ints with "
                f"1 <= fewest <= most, got {self.reply_tokens!r}"
            )
        if self.tool_output_tokens is not None and not _count(self.tool_output_tokens, 1):
            raise OpenLoopWorkloadError(
                f"tool_output_tokens must be an int >= 1, or None to append tool outputs "
                f"raw, got {self.tool_output_tokens!r}"
            )
        if not _count(self.system_tokens, 1):
            raise OpenLoopWorkloadError(
                f"system_tokens must be an int >= 1, got {self.system_tokens!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise OpenLoopWorkloadError(f"seed must be an int, got {self.seed!r}")
        if not isinstance(self.facts, bool):
            raise OpenLoopWorkloadError(
                f"facts is True to plant facts in the tool outputs, else False, got {self.facts!r}"
            )
        share = self.summary_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
            raise OpenLoopWorkloadError(
                f"summary_share is the part of ceiling_tokens the running summary may take, "
                f"a number between 0 and 1 (exclusive), got {share!r}"
            )
        to = self.compact_to
        if isinstance(to, bool) or not isinstance(to, (int, float)) or not 0 < to <= 1:
            raise OpenLoopWorkloadError(
                f"compact_to is the part of ceiling_tokens a compaction goes down to, a "
                f"number in (0, 1] (1: to the ceiling), got {to!r}"
            )
        if self.ceiling_tokens is not None:
            least = self.system_tokens + self.reply_tokens[1] + _MIN_ROOM_TOKENS
            if not _count(self.ceiling_tokens, least):
                raise OpenLoopWorkloadError(
                    f"ceiling_tokens must be an int of at least {least:,} (the system "
                    f"prompt, the longest reply and {_MIN_ROOM_TOKENS} tokens to compact "
                    f"into), or None never to compact, got {self.ceiling_tokens!r}: raise "
                    f"it or lower system_tokens or reply_tokens"
                )


# The twin of the reference card: histories grow to the 16k ceiling, where they are
# compacted, tool outputs reduced to 2,048 tokens as kvgov's default for a coding swarm;
# the rate is the sweep's to set (this one is the low end).
TWIN = OpenLoopWorkload(rate_per_min=1.0, duration_s=600.0)
# What the real tiny engine runs on 2 cores in a few minutes: the same three tenants
# with 6-10 tool calls a worker and narrower teams, contexts to about 5k, 8-24 token
# replies, about four teams over two minutes.
CPU = OpenLoopWorkload(
    rate_per_min=2.0,
    duration_s=120.0,
    tenants=(
        Tenant(name="swe", weight=0.5, workers_per_team=2, turns=(6, 10), mix="swe"),
        Tenant(name="bfcl", weight=0.3, workers_per_team=1, turns=(6, 8), mix="bfcl"),
        Tenant(name="research", weight=0.2, workers_per_team=3, turns=(6, 8), mix="research"),
    ),
    reply_tokens=(8, 24),
    tool_output_tokens=512,
    ceiling_tokens=5_000,
    system_tokens=300,
)


def build(workload: OpenLoopWorkload, counter: TokenCounter) -> tuple[AgentScript, ...]:
    """Every agent's prompts, replies and tool latencies, planners first within each
    team, teams in order of arrival. ``counter`` counts as the engine's tokenizer does
    (``counter_for`` gives a fast one)."""
    return build_planted(workload, counter)[0]


def build_planted(
    workload: OpenLoopWorkload, counter: TokenCounter
) -> tuple[tuple[AgentScript, ...], dict[str, tuple[Fact, ...]]]:
    """``build``'s scripts, and each worker's facts planted in its tool outputs, in the
    order planted (none without ``workload.facts``)."""
    corpus = _Corpus(workload.seed, counter)
    reduce = ExtractiveSummarizer(counter)
    ceiling = workload.ceiling_tokens
    compact = (
        None
        if ceiling is None
        else kvgov_compaction(reduce, ceiling, workload.summary_share, workload.compact_to)
    )
    scripts: list[AgentScript] = []
    planted: dict[str, tuple[Fact, ...]] = {}
    for team, (arrival_s, tenant) in enumerate(arrivals(workload)):
        rng = random.Random(f"kvgov-openloop:{workload.seed}:team:{team}")
        team_build = _Team(workload, tenant, team, rng, counter, corpus, reduce, compact)
        scripts += team_build.scripts(arrival_s)
        planted.update(team_build.planted)
    return tuple(scripts), planted


def prompts(
    scripts: Sequence[AgentScript], tokenizer: Tokenizer
) -> dict[tuple[str, int], list[int]]:
    """The chat template's token ids each call sends: ``tokenizer.encode_chat`` of its
    messages. Encoded line by line with each line's ids kept (a history repeats every line
    of the turn before); every agent's last prompt is checked against ``encode_chat``, and
    where one differs every prompt is encoded whole."""
    lines = LineIds(tokenizer)
    ids = {
        (s.name, i): lines.encode_chat(t.messages) for s in scripts for i, t in enumerate(s.turns)
    }
    for s in scripts:
        last = len(s.turns) - 1
        if ids[(s.name, last)] != tokenizer.encode_chat(list(s.turns[last].messages)):
            return {
                (agent.name, i): tokenizer.encode_chat(list(t.messages))
                for agent in scripts
                for i, t in enumerate(agent.turns)
            }
    return ids


def counter_for(tokenizer: Tokenizer) -> TokenCounter:
    """A ``TokenCounter`` for ``build`` that counts a chat as ``len(encode_chat(...))``,
    a line's ids encoded once; the tokenizer itself where its encoding does not split at
    line starts (checked on the corpus)."""
    lines = LineIds(tokenizer)
    probe = [
        {"role": "system", "content": "Be terse.\n\n  Keep the error lines.\t\n"},
        *({"role": "user", "content": d.text[:6_000]} for d in build_corpus(num_documents=5)),
    ]
    if lines.encode_chat(probe) != tokenizer.encode_chat(probe):
        return TokenCounter(tokenizer=tokenizer)
    return TokenCounter(tokenizer=lines)


def describe(workload: OpenLoopWorkload) -> str:
    """One line saying what ran, for a benchmark's notes."""
    tenants = ", ".join(
        f"{t.name} {t.weight:g} (planner + {t.workers_per_team}, {t.turns[0]}-{t.turns[1]} "
        f"turns, {t.mix} tools)"
        for t in workload.tenants
    )
    reduced = (
        "raw tool outputs"
        if workload.tool_output_tokens is None
        else f"tool outputs reduced to {workload.tool_output_tokens:,}"
    )
    ceiling = (
        "no ceiling"
        if workload.ceiling_tokens is None
        else f"compacted at {workload.ceiling_tokens:,} (SummarizeOldest"
        + (
            ""
            if workload.summary_share == SUMMARY_SHARE
            else f", a summary of up to {workload.summary_share:g} of it"
        )
        + ("" if workload.compact_to == 1 else f", down to {workload.compact_to:g} of it")
        + ")"
    )
    return (
        f"open loop: teams at {workload.rate_per_min:g}/min (Poisson) for "
        f"{workload.duration_s:g} s, seed {workload.seed}; tenants {tenants}; replies "
        f"{workload.reply_tokens[0]}-{workload.reply_tokens[1]} tokens; system prompt "
        f"~{workload.system_tokens:,}; {reduced}; {ceiling}"
        + ("; facts planted in every tool output" if workload.facts else "")
    )


def arrivals(workload: OpenLoopWorkload) -> list[tuple[float, Tenant]]:
    """Each team's arrival (seconds, ascending) and tenant: exponential gaps, a team at
    0 s when none falls in the window (a run has at least one); ``build``'s teams."""
    rng = random.Random(f"kvgov-openloop:{workload.seed}:arrivals")
    tenants, weights = workload.tenants, [t.weight for t in workload.tenants]
    per_s = workload.rate_per_min / 60.0
    # A team's gap and tenant are drawn together, so a longer window keeps the teams of a
    # shorter one.
    teams: list[tuple[float, Tenant]] = []
    at, tenant = rng.expovariate(per_s), rng.choices(tenants, weights)[0]
    while at < workload.duration_s:
        teams.append((at, tenant))
        at, tenant = at + rng.expovariate(per_s), rng.choices(tenants, weights)[0]
    return teams or [(0.0, tenant)]


class _Team:
    """One team's scripts: its workers' histories grown turn by turn, then its planner."""

    def __init__(
        self,
        workload: OpenLoopWorkload,
        tenant: Tenant,
        team: int,
        rng: random.Random,
        counter: TokenCounter,
        corpus: _Corpus,
        reduce: ExtractiveSummarizer,
        compact: SummarizeOldest | None,
    ) -> None:
        self.workload, self.tenant, self.team, self.rng = workload, tenant, team, rng
        self.counter, self.corpus, self.reduce, self.compact = counter, corpus, reduce, compact
        self.area = _AREAS[team % len(_AREAS)]
        self.prefix = f"{tenant.name}-t{team}"
        self.system: Message = {"role": "system", "content": self._system_text()}
        self.planted: dict[str, tuple[Fact, ...]] = {}  # a worker -> its facts, with facts

    def scripts(self, arrival_s: float) -> list[AgentScript]:
        workers = [self._worker(j) for j in range(self.tenant.workers_per_team)]
        return [self._planner(workers, arrival_s), *workers]

    def _worker(self, j: int) -> AgentScript:
        rng, tools = self.rng, MIXES[self.tenant.mix]
        task = _TASKS[self.tenant.mix].format(area=self.area, team=self.team, worker=j)
        history: list[Message] = [self.system, {"role": "user", "content": task}]
        num_calls = rng.randint(*self.tenant.turns)
        last = ""  # the latest tool output, which the next reply cites
        turns = []
        planted: list[Fact] = []
        for t in range(num_calls + 1):
            reply = rng.randint(*self.workload.reply_tokens)
            history = self._fit(history, reply)
            if t == num_calls:
                turns.append(Turn(tuple(history), None, 0.0, 0.0, reply))
                break
            tool = rng.choices(tools, [x.weight for x in tools])[0]
            turns.append(Turn(tuple(history), tool.name, tool.draw_s(rng), tool.mean_s, reply))
            output, arguments = self.corpus.cut(
                tool, rng.randint(tool.min_tokens, tool.max_tokens), rng
            )
            if self.workload.facts:
                # Its own draws: the workload's stay those it makes without facts.
                at = f"kvgov-openloop:{self.workload.seed}:facts:{self.prefix}-w{j}:{t}"
                output, found = planting.plant(
                    output, tool.category, random.Random(at), package=self.area
                )
                planted += found
            if self.workload.tool_output_tokens is not None:
                output = self.reduce.reduce(
                    output,
                    budget_tokens=self.workload.tool_output_tokens,
                    tool_name=tool.name,
                    arguments=arguments,
                ).text
            said = self._text(
                _THOUGHTS,
                reply,
                quote=last,
                tail=chat_text.calling(tool.name, arguments),
                verb=_VERBS[tool.name],
            )
            last = output
            history = [
                *history,
                {"role": "assistant", "content": said},
                {"role": "user", "content": chat_text.RESULT + output},
            ]
        if planted:
            self.planted[f"{self.prefix}-w{j}"] = tuple(planted)
        return AgentScript(
            f"{self.prefix}-w{j}", self.team, False, tuple(turns), 0.0, self.tenant.name
        )

    def _planner(self, workers: Sequence[AgentScript], arrival_s: float) -> AgentScript:
        rng, n = self.rng, len(workers)
        ask: Message = {
            "role": "user",
            "content": _ASKS[self.tenant.mix].format(area=self.area, team=self.team, n=n),
        }
        plan_reply, merge_reply = (rng.randint(*self.workload.reply_tokens) for _ in range(2))
        tasks = "\n".join(
            f"- worker {j}: "
            + _TASKS[self.tenant.mix].format(area=self.area, team=self.team, worker=j)
            for j in range(n)
        )
        plan = self._text(_PLANS, plan_reply, lead=tasks, area=self.area, n=n)
        reports = "\n".join(
            f"worker {j}: {self._text(_REPORTS, 40, area=self.area, worker=j)}" for j in range(n)
        )
        merge = (
            self.system,
            ask,
            {"role": "assistant", "content": plan},
            {"role": "user", "content": f"Merge these reports:\n{reports}"},
        )
        # The workers run at once: the fan-out lasts about as long as the longest one's
        # tools, which is what every policy is told to expect.
        expected = max(sum(t.expected_s for t in w.turns) for w in workers)
        turns = (
            Turn((self.system, ask), "fanout", 0.0, expected, plan_reply),
            Turn(merge, None, 0.0, 0.0, merge_reply),
        )
        return AgentScript(
            f"{self.prefix}-planner", self.team, True, turns, arrival_s, self.tenant.name
        )

    def _fit(self, history: list[Message], reply_tokens: int) -> list[Message]:
        """The history compacted so the next call and its reply fit the ceiling (as it is,
        with no ceiling)."""
        ceiling = self.workload.ceiling_tokens
        if ceiling is None or self.compact is None:
            return history
        try:
            compacted, _ = self.compact.compact(
                chat_text.as_calls(history),
                ceiling_tokens=ceiling,
                reserve_tokens=reply_tokens,
                # A TokenCounter in all the policy calls, over the calls' chat text.
                counter=chat_text.TextCounter(self.counter),  # type: ignore[arg-type]  # see above
            )
        except CeilingExceeded as exc:
            raise OpenLoopWorkloadError(
                f"{self.prefix}: a history cannot be compacted under ceiling_tokens="
                f"{ceiling:,} ({exc}); raise ceiling_tokens or lower tool_output_tokens"
            ) from exc
        return chat_text.as_text(compacted)

    def _system_text(self) -> str:
        """The tenant's instructions and its tools' schemas, then this team's line: about
        ``system_tokens`` in all, the tenant's part the same for all its teams."""
        schemas = "\n".join(
            json.dumps(
                {
                    "name": t.name,
                    "description": _DESCRIPTIONS[t.name],
                    "parameters": {"type": "object"},
                }
            )
            for t in MIXES[self.tenant.mix]
        )
        head = f"{_INSTRUCTIONS[self.tenant.mix]}\n\n# Tools\n{schemas}\n\n# Notes\n"
        team = f"\nYou are on team {self.team}; it owns the {self.area} services."
        room = max(0, self.workload.system_tokens - self.counter.count(team))
        # Notes repeat until the room is full; a prompt shorter than the instructions and
        # schemas cuts them instead.
        notes = " ".join(_NOTES * (1 + room // 40))
        return self.counter.truncate(head + notes, room) + team

    def _text(
        self,
        sentences: Sequence[str],
        tokens: int,
        *,
        lead: str = "",
        quote: str = "",
        tail: str = "",
        **fields: Any,
    ) -> str:
        """About ``tokens`` tokens: ``lead``, then ``sentences`` in a drawn order, then the
        lines of ``quote`` (what an agent cites of its last result), then the sentences
        again; ``tail`` last, whole."""
        count = self.counter.count
        room = tokens - count(tail)
        parts = [lead] if lead else []
        total = count(lead)
        quoted = [f"> {line}" for line in quote.split("\n") if line.strip()]
        while total < room:
            batch = [s.format(**fields) for s in self.rng.sample(sentences, len(sentences))]
            if quoted:
                batch, quoted = [*batch, "From the result:", *quoted], []
            for part in batch:
                if total >= room:
                    break
                parts.append(part)
                total += count(part) + 1
        separator = "\n" if quote or lead else " "
        return self.counter.truncate(separator.join(parts), max(room, 0)) + tail


class _Corpus:
    """Tool outputs of a given size cut from the corpus documents of a category: a window
    of whole lines from a drawn line on, joining the next document where one runs out."""

    def __init__(self, seed: int, counter: TokenCounter) -> None:
        self.counter = counter
        self.lines: dict[str, list[list[str]]] = {}
        self.arguments: dict[str, list[Mapping[str, str]]] = {}
        for document in build_corpus(num_documents=40, seed=seed):
            kind = document.category.value
            self.lines.setdefault(kind, []).append(document.text.split("\n"))
            self.arguments.setdefault(kind, []).append(document.arguments)

    def cut(self, tool: Tool, tokens: int, rng: random.Random) -> tuple[str, dict[str, str]]:
        documents = self.lines[tool.category]
        index = rng.randrange(len(documents))
        lines = documents[index]
        at = rng.randrange(max(1, len(lines) // 2))
        taken: list[str] = []
        total = 0
        while total < tokens:
            if at == len(lines):
                index = (index + 1) % len(documents)
                lines, at = documents[index], 0
            taken.append(lines[at])
            total += self.counter.count(lines[at]) + 1
            at += 1
        return self.counter.truncate("\n".join(taken), tokens), dict(
            self.arguments[tool.category][index]
        )


_AREAS = ("billing", "search", "ingest", "auth", "storage", "notifications")
_INSTRUCTIONS = {
    "swe": "You are a software engineer agent. You resolve one GitHub issue in the repository "
    "checked out for you: read the code, reproduce the failure, edit the fix, run the tests. "
    "Each tool result is evidence; keep the failing test names, the error lines and the paths. "
    "Make the smallest change that fixes the issue and report what you changed and why.",
    "bfcl": "You are a customer-service assistant with access to the company's APIs. Complete "
    "the customer's request with as few calls as you can; call a function only with "
    "arguments the customer gave or an earlier call returned. Never invent identifiers. "
    "When the request is done, say what you did in one or two sentences.",
    "research": "You are a research agent. Answer one question from sources you find: search, "
    "read the pages that look authoritative, and note each claim with the page it came from. "
    "Prefer primary sources and recent dates; say where sources disagree. Report the answer, "
    "its sources and what is still uncertain.",
}
_DESCRIPTIONS = {
    "open_file": "Open a file at a path and show up to 100 lines from a line number.",
    "search": "Search the repository for a pattern; list the matching files and lines.",
    "edit": "Replace a range of lines in the open file and show the edited window.",
    "run_tests": "Run the test suite or one test module and return its log.",
    "run_repro": "Run a reproduction script with python and return its output.",
    "api_get": "Read a resource of the company's API by path and query parameters.",
    "api_post": "Create or change a resource of the company's API; returns the result.",
    "web_search": "Search the web; returns titles, URLs and snippets of the top results.",
    "fetch_page": "Fetch a URL and return its main text.",
}
_VERBS = {
    "open_file": "open the file",
    "search": "search the repository",
    "edit": "apply the change",
    "run_tests": "run the tests",
    "run_repro": "run the reproduction script",
    "api_get": "read the record",
    "api_post": "submit the change",
    "web_search": "search for it",
    "fetch_page": "read the page",
}
_NOTES = (
    "Runbooks, dashboards and on-call notes of the owning team apply to every task.",
    "Do not repeat tool output back; quote the one line that matters.",
    "When a tool fails, read its error before calling it again with other arguments.",
    "Stop and report when the evidence is enough; more calls cost the customer time.",
)
_TASKS = {
    "swe": "Issue {team}.{worker}: the nightly build of the {area} services fails in its "
    "integration tests since the last merge. Find the cause and fix it.",
    "bfcl": "Request {team}.{worker}: a customer of {area} asks to move their two open orders to "
    "the new address on file and to refund the shipping fee of the cancelled one.",
    "research": "Question {team}.{worker}: how do other teams run {area} services under bursty "
    "load, and which of their practices would apply to ours?",
}
_ASKS = {
    "swe": "Split the failing nightly build of the {area} services (team {team}) into {n} "
    "independent investigations.",
    "bfcl": "Handle the {area} customer's request (team {team}) with {n} assistant(s).",
    "research": "Split the {area} question of team {team} into {n} lines of research.",
}
_PLANS = (
    "Worker 0 takes the first suspect in {area}; the others take one each, in parallel.",
    "Each of the {n} workers reports the cause it finds and the evidence for it.",
    "I will merge their findings and drop anything two of them contradict.",
    "The split follows the ownership of the {area} code, so no two workers overlap.",
)
_REPORTS = (
    "the failure in {area} reproduces and its cause is in the code the worker {worker} read.",
    "the evidence is in the tool results above; one change fixes it.",
    "no other service is involved.",
)
_THOUGHTS = (
    "The last result narrows it down, so next I {verb} to confirm where it breaks.",
    "Nothing in that output contradicts the current hypothesis.",
    "I keep the failing names and the error lines from the result above and drop the rest.",
    "Before changing anything I want to see the exact state, so I {verb}.",
    "That matches what the earlier result showed on the same path.",
    "If this does not show the cause, the fallback is to compare with the last good run.",
    "The numbers in that result are consistent with a timeout rather than a crash.",
    "One more look should settle it: I {verb}.",
)
