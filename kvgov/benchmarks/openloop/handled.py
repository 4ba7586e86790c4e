"""One open-loop workload as each system of the whole-system comparison sends it:
kvgov's (tool outputs reduced, histories compacted, as ``panel`` runs it) and each
LangChain handling's (raw tool outputs, ``langchain_context``), facts planted in every
raw tool output, on the same jobs.

Invariants: every handling runs the same jobs (each call's tool, latency and reply,
each team's arrival) and the same planted facts, checked at every build; every call
with its reply fits the model's window; ``Prepared.retimed`` gives, for another rate
whose window draws the same teams, what a fresh build gives.

Errors: ``HandledWorkloadError`` (a ``ValueError``) for a workload the comparison cannot
use; its message says what to change.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvgov.benchmarks.context_workload import Fact
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.langchain_context import (
    CONTEXT_EDITING,
    TRIM,
    ContextHandling,
    handle,
)
from kvgov.benchmarks.openloop.workload_setup import WorkloadSetup, longest_call
from kvgov.benchmarks.swarm.workload import AgentScript

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer
    from governor import TokenCounter
    from kvgov.benchmarks.openloop.editing_knobs import EditingKnobs

__all__ = ["KVGOV", "HandledWorkloadError", "Prepared", "counter", "prepare", "prepare_kvgov"]

KVGOV = "kvgov"  # kvgov's policy, and its context handling


class HandledWorkloadError(ValueError):
    """A workload the whole-system comparison cannot use."""


@dataclass(slots=True)
class Prepared:
    """One workload as each handling sends it: its ``WorkloadSetup`` by handling
    (``KVGOV`` and each of ``HANDLINGS``), every worker's planted facts, and the calls
    context editing left over the window."""

    setups: dict[str, WorkloadSetup]
    facts: dict[str, tuple[Fact, ...]]
    num_trimmed_after_edit: int

    def retimed(self, workload: openloop.OpenLoopWorkload) -> Prepared | None:
        """These setups with their teams arriving as in ``workload``, where ``workload``
        is this one at another rate and window that draw the same teams (a window holding
        the same expected teams: its gaps scaled, its teams and their draws the same);
        None where it is not."""
        ours = self.setups[KVGOV].workload
        at_ours = dataclasses.replace(
            workload, rate_per_min=ours.rate_per_min, duration_s=ours.duration_s
        )
        if at_ours != ours:
            return None
        teams = openloop.arrivals(workload)
        planners = [s for s in self.setups[KVGOV].scripts if s.planner]
        if [(s.team, s.tenant) for s in planners] != [
            (i, t.name) for i, (_, t) in enumerate(teams)
        ]:
            return None
        setups = {}
        for handling, setup in self.setups.items():
            scripts = tuple(
                dataclasses.replace(s, arrival_s=teams[s.team][0]) if s.planner else s
                for s in setup.scripts
            )
            shape = dataclasses.replace(
                setup.workload, rate_per_min=workload.rate_per_min, duration_s=workload.duration_s
            )
            setups[handling] = dataclasses.replace(setup, workload=shape, scripts=scripts)
        return Prepared(setups, self.facts, self.num_trimmed_after_edit)


def prepare(
    workload: openloop.OpenLoopWorkload,
    *,
    window_tokens: int,
    editing: EditingKnobs,
    block_size: int,
) -> Prepared:
    """``workload`` (facts planted) as each handling sends it to a model of
    ``window_tokens``, context editing with ``editing``'s trigger and keep;
    ``block_size`` for each setup's peak blocks."""
    if not workload.facts:
        raise HandledWorkloadError(
            "the whole-system comparison measures facts kept: build it from a workload "
            "with facts=True"
        )
    window, count, tokenizer = window_tokens, counter(), _tokenizer()
    scripts, facts = openloop.build_planted(workload, count)
    raw = dataclasses.replace(workload, tool_output_tokens=None, ceiling_tokens=None)
    raw_scripts, raw_facts = openloop.build_planted(raw, count)
    if raw_facts != facts or _jobs(raw_scripts) != _jobs(scripts):
        raise HandledWorkloadError(
            f"seed {workload.seed} at {workload.rate_per_min:g} teams/min: the jobs (tools, "
            "latencies, replies, facts) differ between raw and reduced tool outputs, so the "
            "systems would not run the same jobs; use another seed or window, and report it"
        )
    trimmed = handle(raw_scripts, ContextHandling(name=TRIM, window_tokens=window), count)
    edited = handle(raw_scripts, editing.handling(window), count)
    setups = {
        KVGOV: _setup(workload, scripts, tokenizer, block_size, window),
        TRIM: _setup(raw, trimmed.scripts, tokenizer, block_size, window),
        CONTEXT_EDITING: _setup(raw, edited.scripts, tokenizer, block_size, window),
    }
    return Prepared(setups, facts, edited.num_trimmed_after_edit)


def prepare_kvgov(
    workload: openloop.OpenLoopWorkload, like: Prepared, *, window_tokens: int, block_size: int
) -> WorkloadSetup:
    """kvgov's handling of ``workload`` (facts planted; its own ceiling and tool-output
    budget) beside ``like``'s: the same jobs and facts, checked, or
    ``HandledWorkloadError``."""
    scripts, facts = openloop.build_planted(workload, counter())
    if facts != like.facts or _jobs(scripts) != _jobs(like.setups[KVGOV].scripts):
        raise HandledWorkloadError(
            f"seed {workload.seed}: kvgov's context at {workload.ceiling_tokens:,} tokens "
            "draws other jobs than the comparison's, so the systems would not run the same "
            "jobs; use another ceiling or seed, and report it"
        )
    return _setup(workload, scripts, _tokenizer(), block_size, window_tokens)


@functools.cache
def _tokenizer() -> Tokenizer:
    """The stand-in engine's tokenizer: the ids the twin's engine is sent."""
    from engine.presets import PRESETS
    from engine.tokenizer import load_tokenizer

    return load_tokenizer(PRESETS["tiny-random"].tokenizer)


@functools.cache
def counter() -> TokenCounter:
    """Counts as the stand-in engine's tokenizer does (``workload.counter_for``)."""
    return openloop.counter_for(_tokenizer())


def _jobs(scripts: Sequence[AgentScript]) -> list[tuple[Any, ...]]:
    """What makes a job the same job whatever its context: its calls' tools, latencies
    and replies, and when it arrives."""
    return [
        (
            s.name,
            s.arrival_s,
            tuple((t.tool, t.tool_s, t.expected_s, t.reply_tokens) for t in s.turns),
        )
        for s in scripts
    ]


def _setup(
    workload: openloop.OpenLoopWorkload,
    scripts: tuple[AgentScript, ...],
    tokenizer: Tokenizer,
    block_size: int,
    window_tokens: int,
) -> WorkloadSetup:
    """``WorkloadSetup`` of scripts made here (``WorkloadSetup.of`` builds its own),
    every call checked to fit the model's window with its reply."""

    prompts = openloop.prompts(scripts, tokenizer)
    for script in scripts:
        longest = longest_call(script, prompts)
        assert longest <= window_tokens, f"{script.name}: a call of {longest:,} tokens"
    return WorkloadSetup.of_scripts(workload, scripts, prompts, block_size)
