"""The pressure protocol: whose KV to move when device blocks run short.

Under pressure (blocks in use above ``GovernorConfig.pressure_watermark`` of the pool)
the governor frees blocks held by idle agents: contexts retained between calls
(``Backend.retain``) are offloaded to host memory, or dropped back to the prefix cache
when the host has no room. A ``PressurePolicy`` orders the candidates and says why; the
governor takes them in that order until enough blocks are free, and records each choice
as an event with its reason. Leases in the middle of a model call are left to the engine,
which preempts by priority, newest first.

The default, ``PressureOrder``, takes the lowest priority first, then parked leases
before active ones, then the one expected back last (Belady's rule: move what is needed
again furthest in the future), then the one holding the most blocks, then the newest.
A tool is expected back after its expected duration (``tool_call``'s ``expected_s``, as
InferCept and Continuum price their choices, else the mean of that tool's calls so far:
``ToolDurations``), or, once it has run past half of that, after twice the time it has
run so far: tool latencies are heavy-tailed, and one that overruns is likely to run on.
A lease waiting on its children, or on a tool never seen to end, counts as furthest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from governor.clock import SYSTEM_CLOCK, Clock
from governor.lease import Lease, LeaseState

__all__ = ["PressureChoice", "PressureOrder", "PressurePolicy"]


@dataclass(frozen=True, slots=True)
class PressureChoice:
    """One lease chosen to give blocks back, and why."""

    lease: Lease
    num_blocks: int  # device blocks its retained context holds
    reason: str


@runtime_checkable
class PressurePolicy(Protocol):
    """Chooses whose retained KV to move to free ``num_blocks_needed`` device blocks.

    ``candidates`` hold resident retained contexts (``lease.num_retained_blocks > 0``);
    the answer lists some of them, in the order to move them, each once.
    """

    def choose(
        self, candidates: Sequence[Lease], *, num_blocks_needed: int
    ) -> list[PressureChoice]: ...


class PressureOrder:
    """Lowest priority first, then parked before active, expected back last, most
    blocks, newest. ``clock``: the one the leases' ``tool_started_at`` were read from,
    the governor's (the governor's own default is given it; pass it to one made for a
    governor on another clock)."""

    __slots__ = ("_clock",)

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock

    def __repr__(self) -> str:
        if self._clock is SYSTEM_CLOCK:
            return "PressureOrder()"
        return f"PressureOrder(clock={self._clock!r})"

    def choose(
        self, candidates: Sequence[Lease], *, num_blocks_needed: int
    ) -> list[PressureChoice]:
        now = self._clock.now()
        ranked = sorted(
            candidates,
            key=lambda lease: (
                lease.priority,
                lease.state is not LeaseState.PARKED,
                -_due(lease, now),
                -lease.num_retained_blocks,
                -lease.arrival,
            ),
        )
        chosen: list[PressureChoice] = []
        freed = 0
        for lease in ranked:
            if freed >= num_blocks_needed:
                break
            state = "parked" if lease.state is LeaseState.PARKED else "idle"
            due = _due(lease, now)
            back = "" if math.isinf(due) else f", due back in {max(0.0, due - now):.2f} s"
            chosen.append(
                PressureChoice(
                    lease,
                    lease.num_retained_blocks,
                    f"priority {lease.priority}, {state}{back}, "
                    f"{lease.num_retained_blocks} blocks, request #{lease.arrival}",
                )
            )
            freed += lease.num_retained_blocks
        return chosen


def _due(lease: Lease, now: float) -> float:
    """When a parked lease is expected back (on the governor's clock): its tool's start plus
    the larger of its expected duration and twice its time so far; infinity when that
    is not known (waiting on its children, or a tool of unknown length)."""
    started, expected = lease.tool_started_at, lease.tool_expected_s
    if started is None or expected is None or lease.state is not LeaseState.PARKED:
        return math.inf
    return started + max(expected, 2 * (now - started))
