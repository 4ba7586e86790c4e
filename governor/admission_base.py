"""``AdmissionBase``: what every admission ledger shares, in process or on a store.

The limits come from the backend's capacity and the config alone (``limit_blocks``,
``max_concurrent``, whether a ceiling can ever fit); the queue and the ledger are the
subclass's: ``AdmissionController`` in this process (the default), or
``governor.store.SharedAdmission`` on a store that governors of several processes share.
The ``a``-prefixed verbs are what an event loop awaits: in process they are the plain
verbs (bookkeeping in memory, nothing to wait for); on a store they wait for its answer
off the loop. ``check_live`` and ``expired`` answer for leases that can outlive their
room (a store's, whose process stopped heartbeating); in process none can.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from governor.admission_policy import AdmissionPolicy
from governor.config import AdmissionMode, GovernorConfig
from governor.errors import AdmissionRejected
from governor.lease import Lease
from governor.placement import Placement
from governor.sizing import max_ceiling_tokens, max_concurrent
from governor.wakeup import Waiter

if TYPE_CHECKING:
    from governor.tool_durations import ToolDurations

__all__ = ["AdmissionBase"]


class AdmissionBase(ABC):
    # Whether a released lease's engine budget closes before its room returns: on a
    # shared store, where another process may be admitted into the room at once.
    budget_before_room = False

    def __init__(self, *, config: GovernorConfig, available_blocks: int, block_size: int) -> None:
        self.config = config
        self.available_blocks = available_blocks
        self.block_size = block_size
        # make_room(num_blocks): move that many held blocks of leases not active out of
        # the way; it must not wait (it schedules), and answers with room_made().
        self.make_room: Callable[[int], None] | None = None
        # on_reaped(budgets): engine budgets of leases another process lost, for this
        # process to close (a store's; never called in process).
        self.on_reaped: Callable[[Collection[str]], None] | None = None
        self._placement_: Placement | None = None

    # -- limits ---------------------------------------------------------------------
    @property
    def placement(self) -> Placement | None:
        """A backend of several replicas: where a lease fits (guaranteed mode only; see
        governor.placement). Set before the first lease is queued."""
        return self._placement_

    @placement.setter
    def placement(self, placement: Placement | None) -> None:
        self._placement_ = placement

    @property
    def limit_blocks(self) -> int:
        return math.floor(self.available_blocks * self.config.safety_factor)

    def max_concurrent(self, ceiling_tokens: int, prefix_blocks: int = 0) -> int:
        """How many leases of this ceiling guaranteed mode runs at once, each starting
        with a shared prefix of ``prefix_blocks`` pinned blocks (counted once, in the pins)."""
        fit = max_concurrent(
            self.available_blocks,
            ceiling_tokens,
            self.block_size,
            self.config.safety_factor,
            prefix_blocks,
        )
        cap = self.config.max_concurrent
        return fit if cap is None else min(fit, cap)

    def check_can_ever_fit(self, lease: Lease) -> None:
        if lease.own_blocks_reserved > self._most_blocks():
            raise AdmissionRejected(
                lease.ceiling_tokens, self._most_tokens(lease), agent=lease.agent.name
            )

    def _most_blocks(self) -> int:
        """The most blocks one lease can ever be admitted with: within the limit, and
        within one replica's where the backend is several (``placement``)."""
        placement = self._placement()
        if placement is None:
            return self.limit_blocks
        return min(self.limit_blocks, placement.max_blocks())

    def _most_tokens(self, lease: Lease) -> int:
        """The largest ceiling the lease could be admitted with (its shared prefix's
        pinned blocks on top: they are not in the limit)."""
        possible = max_ceiling_tokens(
            self.available_blocks, self.block_size, self.config.safety_factor
        )
        most = min(possible, self._most_blocks() * self.block_size)
        return most + lease.prefix_blocks * self.block_size

    def _placement(self) -> Placement | None:
        return self.placement if self.config.mode is AdmissionMode.GUARANTEED else None

    # -- the verbs (the subclass's), and what an event loop awaits ----------------------
    def lease_id(self, number: int) -> str:
        """The id of this governor's ``number``-th lease (its engine budget's name
        follows from it): unique among the leases this ledger counts."""
        return str(number)

    @property
    @abstractmethod
    def policy(self) -> AdmissionPolicy: ...

    @policy.setter
    @abstractmethod
    def policy(self, policy: AdmissionPolicy) -> None: ...

    @abstractmethod
    def set_available_blocks(self, available_blocks: int) -> None: ...

    @abstractmethod
    def enqueue(self, lease: Lease, waiter: Waiter) -> None: ...

    @abstractmethod
    def park(self, lease: Lease, *, ceiling_tokens: int | None = None) -> bool: ...

    @abstractmethod
    def set_held(self, lease: Lease, num_blocks: int) -> None: ...

    @abstractmethod
    def room_made(self) -> None: ...

    @abstractmethod
    def counts(self) -> tuple[int, int, int]:
        """Active leases, waiting leases, peak active so far."""
        ...

    @abstractmethod
    def ledger(self) -> tuple[int, int, int, int]: ...

    @abstractmethod
    def blocks_committed(self) -> int: ...

    @abstractmethod
    def cancel(self, lease: Lease) -> bool: ...

    @abstractmethod
    def release(self, lease: Lease) -> None: ...

    @abstractmethod
    def try_grow(self, lease: Lease, ceiling_tokens: int) -> bool: ...

    async def aenqueue(self, lease: Lease, waiter: Waiter) -> None:
        self.enqueue(lease, waiter)

    async def acancel(self, lease: Lease) -> bool:
        return self.cancel(lease)

    async def arelease(self, lease: Lease) -> None:
        self.release(lease)

    async def atry_grow(self, lease: Lease, ceiling_tokens: int) -> bool:
        return self.try_grow(lease, ceiling_tokens)

    # -- leases that outlive their room (a store's) -------------------------------------
    def check_live(self, lease: Lease) -> None:  # noqa: B027 - a hook; in process, nothing
        """Raise ``LeaseExpired`` when the lease's room was given away; in process a
        lease's room lasts until it is released."""

    async def acheck_live(self, lease: Lease) -> None:
        self.check_live(lease)

    def expired(self, lease: Lease) -> bool:
        """Whether the lease expired (its engine budget closed by whoever reaped it)."""
        return False

    def raise_if_expired(self, lease: Lease) -> None:  # noqa: B027 - a hook; in process, nothing
        """``LeaseExpired`` when this ledger already knows the lease expired (no I/O)."""

    def opening_budget(self, lease: Lease) -> None:  # noqa: B027 - a hook; in process, nothing
        """The lease's engine budget is about to open: a store records it first, so the
        process that reaps the lease knows to close it."""

    async def aopening_budget(self, lease: Lease) -> None:
        self.opening_budget(lease)

    def budget_closed(self, budget: str) -> None:  # noqa: B027 - a hook; in process, nothing
        """An engine budget ``on_reaped`` handed over is closed: its room may return."""

    def share_tool_durations(self, durations: ToolDurations) -> None:  # noqa: B027 - a hook; in process, nothing
        """Keep ``durations`` with other governors' where the ledger is shared; in
        process it is this governor's alone."""

    def close(self) -> None:  # noqa: B027 - a hook; in process, nothing
        """Stop what the ledger runs beside the governor (a store's threads)."""
