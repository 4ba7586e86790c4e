"""What the engine thread publishes for readers that need no engine step.

``EngineLoop`` takes one ``LoopSnapshot`` after every step and after every command it
runs (before that command's caller is answered), and swaps it in by reference: a reader
on any thread gets the whole object of one instant, never a mix of two, and never waits
for the step in progress to end. What a caller changed through the loop (a budget
opened, a hold made) is in every snapshot read after its call returned; what the step
now running changes is not, until it ends.

Only figures that are cheap to read between two steps belong here: metrics and
capacity. The KV map (``Engine.kv_snapshot``) walks every budget's blocks and stays a
command.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.engine import Engine
from engine.outputs import Capacity, EngineMetrics

__all__ = ["LoopSnapshot", "take"]


@dataclass(frozen=True, slots=True)
class LoopSnapshot:
    """The engine's metrics and capacity read together, between two steps."""

    metrics: EngineMetrics
    capacity: Capacity
    num_steps: int  # engine steps the loop had run when it was taken
    taken_at: float  # time.perf_counter() when it was taken


def take(engine: Engine, num_steps: int) -> LoopSnapshot:
    """Read one snapshot; only on the thread that owns the engine."""
    return LoopSnapshot(engine.metrics(), engine.capacity(), num_steps, time.perf_counter())
