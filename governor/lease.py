"""A lease: the governor's grant of context to one running agent.

Context length is requested, granted, grown and returned, like memory. A lease is
WAITING until admission grants it, ACTIVE while it may call the model, PARKED while it
waits on a tool or on its children (it then stops counting against the concurrency
limit), and RELEASED at the end. Each lease owns one engine budget sized to its
ceiling, so the engine enforces the ceiling, not just the governor's bookkeeping.

A lease's own verbs (``park``, ``resume``, ``grow``) go to its owner, any ``LeaseOwner``:
the ``Governor`` that made it. This module imports nothing that knows a governor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from governor.agent import AgentSpec

__all__ = ["Lease", "LeaseOwner", "LeaseState"]


class LeaseState(Enum):
    WAITING = "waiting"
    ACTIVE = "active"
    PARKED = "parked"
    RELEASED = "released"


class LeaseOwner(Protocol):
    """What a lease asks of whoever made it, for the agent that holds it."""

    def park(self, lease: Lease, *, reason: str = ...) -> None: ...

    def resume(self, lease: Lease) -> Lease: ...

    async def aresume(self, lease: Lease) -> Lease: ...

    def grow(self, lease: Lease, tokens: int) -> None: ...

    async def agrow(self, lease: Lease, tokens: int) -> None: ...


@dataclass(slots=True, eq=False)
class Lease:
    lease_id: str
    agent: AgentSpec
    ceiling_tokens: int
    priority: int
    block_size: int
    arrival: int  # governor-wide order of requests
    # When it was requested, on the governor's clock (Clock.now(): governor.clock), as
    # every time below is; the governor sets them all, so a lease reads no clock itself.
    requested_at: float
    tenant: str | None = None
    parent: Lease | None = None
    run_id: str | None = None  # the Governor.run it was requested in
    state: LeaseState = LeaseState.WAITING
    tokens_in_context: int = 0  # prompt plus output of its latest model call
    admitted_at: float | None = None
    # When it last joined the admission queue (its request, or a re-queue after parking
    # or growing): what priority aging counts from, so time spent running never counts.
    queued_at: float | None = None
    released_at: float | None = None
    num_calls: int = 0
    expected_tokens: int = 0  # the context it is expected to reach, before its first call
    tool: str | None = None  # the tool it waits on, if any
    # When that tool started and how long it is expected to run (its expected_s, else
    # the tool's mean so far: ToolDurations; None: unknown). Written by the lease's
    # thread as the tool starts and ends; the pressure policy reads them (a stale read
    # reorders one choice).
    tool_started_at: float | None = None
    tool_expected_s: float | None = None
    num_retained_tokens: int = 0  # its context's KV held between calls (Backend.retain)
    # What the backend held as the latest call finished (GenerationResult.retained_tokens),
    # until an idle period keeps it or the next call starts.
    retained_at_finish: int = 0
    kv_offloaded: bool = False  # that KV sits in host memory until its next call
    # Blocks of its agent's shared prefix pinned in the backend when it was made: they
    # are out of the admission limit already (the pins), so admission counts them once.
    prefix_blocks: int = 0
    num_compactions: int = 0
    tokens_compacted: int = 0  # tokens removed from its prompts by compaction
    tokens_summarized: int = 0  # tokens removed from its tool results
    governor: LeaseOwner | None = field(default=None, repr=False)  # its owner

    def __post_init__(self) -> None:
        if self.queued_at is None:
            self.queued_at = self.requested_at

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
        """KV blocks its context holds now; before its first call, what it is expected
        to hold (at least one block)."""
        tokens = self.tokens_in_context if self.num_calls else self.expected_tokens
        return max(1, math.ceil(tokens / self.block_size))

    @property
    def own_blocks_reserved(self) -> int:
        """What guaranteed admission reserves for it (at least one block): its ceiling's
        blocks less its shared prefix's pinned blocks, which every lease of the agent
        reuses. Its engine budget is the whole ceiling (``blocks_reserved``)."""
        return max(1, self.blocks_reserved - self.prefix_blocks)

    @property
    def blocks_charged(self) -> int:
        """What overcommit admission charges it (at least one block): its context's blocks
        (``blocks_live``) less its shared prefix's pinned blocks, which every lease of the
        agent reuses."""
        return max(1, self.blocks_live - self.prefix_blocks)

    @property
    def root_requested_at(self) -> float:
        """When the top of its parent chain (itself, without a parent) was requested: its
        calls are served first come, first served by it, so an older program goes first
        (Continuum's program-level order)."""
        lease = self
        while lease.parent is not None:
            lease = lease.parent
        return lease.requested_at

    @property
    def num_retained_blocks(self) -> int:
        """Device blocks its retained context holds now (0 once offloaded)."""
        return 0 if self.kv_offloaded else self.num_retained_tokens // self.block_size

    @property
    def wait_s(self) -> float:
        """Seconds spent waiting for admission (so far, while still waiting)."""
        if self.admitted_at is None:
            return 0.0
        return self.admitted_at - self.requested_at

    @property
    def counts_against_limits(self) -> bool:
        return self.state is LeaseState.ACTIVE

    # -- the lease's own verbs, for the agent that holds it ---------------------------
    def park(self) -> None:
        """Waiting on a tool or on children: stop counting against the limits."""
        self._owner().park(self)

    def resume(self) -> None:
        """Back to work: wait for admission again if parked."""
        self._owner().resume(self)

    async def aresume(self) -> None:
        await self._owner().aresume(self)

    def grow(self, tokens: int) -> None:
        """Raise the ceiling by ``tokens``: granted at once when it fits, else queued
        (parked and re-admitted at the larger size); refused with ``AdmissionRejected``
        when the larger ceiling can never fit."""
        self._owner().grow(self, tokens)

    async def agrow(self, tokens: int) -> None:
        """``grow`` for an event loop: waits for admission without blocking it."""
        await self._owner().agrow(self, tokens)

    def _owner(self) -> LeaseOwner:
        assert self.governor is not None, "a lease is made by Governor.lease()"
        return self.governor
