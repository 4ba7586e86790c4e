"""A lease: the governor's grant of context to one running agent.

Context length is requested, granted, grown and returned, like memory. A lease is
WAITING until admission grants it, ACTIVE while it may call the model, PARKED while it
waits on a tool or on its children (it then stops counting against the concurrency
limit), and RELEASED at the end. Each lease owns one engine budget sized to its
ceiling, so the engine enforces the ceiling, not just the governor's bookkeeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from governor.agent import AgentSpec

__all__ = ["Lease", "LeaseState"]


class LeaseState(Enum):
    WAITING = "waiting"
    ACTIVE = "active"
    PARKED = "parked"
    RELEASED = "released"


@dataclass(slots=True, eq=False)
class Lease:
    lease_id: str
    agent: AgentSpec
    ceiling_tokens: int
    priority: int
    block_size: int
    arrival: int  # governor-wide order of requests
    requested_at: float  # time.monotonic()
    tenant: str | None = None
    parent: Lease | None = None
    state: LeaseState = LeaseState.WAITING
    tokens_in_context: int = 0  # prompt plus output of its latest model call
    admitted_at: float | None = None
    released_at: float | None = None
    num_calls: int = 0
    children: list[Lease] = field(default_factory=list)

    @property
    def budget(self) -> str:
        """The name of the engine budget this lease owns."""
        return f"lease-{self.lease_id}"

    @property
    def blocks_reserved(self) -> int:
        """KV blocks the lease may hold at its ceiling."""
        return math.ceil(self.ceiling_tokens / self.block_size)

    @property
    def blocks_live(self) -> int:
        """KV blocks its context holds now (at least one once it is admitted)."""
        return max(1, math.ceil(self.tokens_in_context / self.block_size))

    @property
    def wait_s(self) -> float:
        """Seconds spent waiting for admission (so far, while still waiting)."""
        if self.admitted_at is None:
            return 0.0
        return self.admitted_at - self.requested_at

    @property
    def counts_against_limits(self) -> bool:
        return self.state is LeaseState.ACTIVE
