"""One (rate, seed)'s workload as every policy is sent it: its scripts, every call's prompt
ids, and the blocks every agent's peak context takes at once.

Built once per workload and shared by every policy (``panel``), by each job's unloaded
run (``unloaded``) and by each context handling of the whole system (``handled``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.workload import OpenLoopWorkload
from kvgov.benchmarks.swarm.workload import AgentScript, SwarmWorkload

__all__ = ["WorkloadSetup", "longest_call"]

_STANDIN = "tiny-random"  # the stand-in engine's model (stand_in_engine): its tokenizer


@dataclass(slots=True)
class WorkloadSetup:
    """One (rate, seed)'s workload: its scripts and every call's prompt ids, shared by
    every policy, and the blocks every agent's peak context takes at once."""

    workload: OpenLoopWorkload
    scripts: tuple[AgentScript, ...]
    prompts: dict[tuple[str, int], list[int]]
    peak_blocks: int

    @classmethod
    def of(cls, workload: OpenLoopWorkload, *, block_size: int) -> WorkloadSetup:
        from engine.presets import PRESETS
        from engine.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(PRESETS[_STANDIN].tokenizer)
        scripts = openloop.build(workload, openloop.counter_for(tokenizer))
        return cls.of_scripts(workload, scripts, openloop.prompts(scripts, tokenizer), block_size)

    @classmethod
    def of_scripts(
        cls,
        workload: OpenLoopWorkload,
        scripts: tuple[AgentScript, ...],
        prompts: dict[tuple[str, int], list[int]],
        block_size: int,
    ) -> WorkloadSetup:
        """The setup of scripts built elsewhere (the whole system's handlings)."""
        peak = sum(math.ceil(longest_call(script, prompts) / block_size) for script in scripts)
        return cls(workload, scripts, prompts, peak)

    @property
    def swarm_workload(self) -> SwarmWorkload:
        """What the kvgov program reads of a workload: its reducer, its ceiling, and a
        reply length for calls that name none (every open-loop turn names its own)."""
        w = self.workload
        return SwarmWorkload(
            reply_tokens=w.reply_tokens[1],
            tool_output_tokens=w.tool_output_tokens,
            ceiling_tokens=w.ceiling_tokens,
            seed=w.seed,
        )


def longest_call(script: AgentScript, prompts: Mapping[tuple[str, int], list[int]]) -> int:
    """The tokens of ``script``'s longest call: its prompt and its reply."""
    return max(
        len(prompts[(script.name, i)]) + (turn.reply_tokens or 0)
        for i, turn in enumerate(script.turns)
    )
