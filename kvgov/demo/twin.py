"""``kvgov demo``'s second act: the swarm at the reference user's scale, on the twin.

The first act runs real generations on the tiny model and keeps everything but memory
governance equal. The second shows what the reference user runs, modelled: eight agents
and Qwen3-8B in int4 on the twin of a 16 GB Radeon RX 9070 XT, ceilings of 16k tokens.
Its columns compare what such a user runs today, reserve-for-max and the paged engine
alone with raw tool outputs up to the model's context, with kvgov's reducer, ceilings and
governance (``kvgov.simulate``; the same as ``kvgov plan --simulate``).
"""

from __future__ import annotations

from typing import TypedDict

from rich.console import Console

from engine.twin import get_profile
from engine.twin.targets import target_model
from kvgov.simulate import Scenario, Simulation, simulate, simulation_table
from kvgov.tables import print_table

__all__ = ["SECOND_ACT", "second_act"]


class _Case(TypedDict):
    device: str
    model: str
    quantize: str
    agents: int
    ceiling: int
    turns: int


# The reference user's case (issue 33's seed): what `kvgov plan --simulate` takes too.
SECOND_ACT: _Case = dict(
    device="rx9070xt", model="qwen3-8b", quantize="int4", agents=8, ceiling=16_000, turns=6
)


def second_act(console: Console) -> Simulation:
    scenario = Scenario(
        profile=get_profile(SECOND_ACT["device"]),
        target=target_model(SECOND_ACT["model"], quantize=SECOND_ACT["quantize"]),
        num_agents=SECOND_ACT["agents"],
        ceiling_tokens=SECOND_ACT["ceiling"],
        turns=SECOND_ACT["turns"],
    )
    console.print()
    console.print(
        "[bold]Second act, modelled on the hardware twin[/]: the reference user's scale. "
        f"{scenario.describe()}. Reserve-for-max and the paged engine alone run what users "
        "have without kvgov (tool outputs appended raw, the history up to the model's "
        f"context); kvgov reduces tool outputs to {scenario.tool_output_tokens:,} tokens, "
        f"compacts at a {scenario.ceiling_tokens:,}-token ceiling and governs the memory. "
        "Decisions are the real engine's and governor's; times and bytes are modelled."
    )
    with console.status("running the twin ..."):
        result = simulate(scenario)
    print_table(console, simulation_table(result))
    return result
