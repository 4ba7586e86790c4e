"""Idle agents: parking, KV retention between calls, offload under pressure, restore.

An agent waits on a tool call, or on the children it fanned out to. While it waits:

1. after ``park_after_s`` it is parked: it stops counting against admission limits, so
   other agents (its own children among them) can run;
2. its context's KV is held (``Backend.retain``) for up to ``retain_s``, so its next call
   reuses it instead of recomputing it; a tool expected to run longer than ``retain_s``
   (``expected_s``) is not worth holding for, and its KV is left to the prefix cache;
3. while blocks in use exceed ``pressure_watermark`` of the pool (checked when a hold
   starts and before every model call), the pressure policy picks whose held KV to
   offload to host memory; with no host room it is dropped to the prefix cache;
4. before its next call an offloaded context is restored; the engine hands the blocks
   to that call, and the hold ends.

Deadlines run on one thread (``governor.deadlines``) and are cancelled when the wait
ends; each idle period is its own object, so a deadline that fires as its wait ends
does nothing.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from governor.backend import Backend
from governor.config import GovernorConfig
from governor.deadlines import Deadline, Deadlines
from governor.errors import BackendError
from governor.events import EventBus, GovernorEvent
from governor.lease import Lease, LeaseState
from governor.pressure import PressurePolicy

__all__ = ["IdleKeeper"]


@dataclass(slots=True, eq=False)
class _Idle:
    reason: str
    timers: list[Deadline] = field(default_factory=list)


class IdleKeeper:
    def __init__(
        self,
        *,
        backend: Backend,
        config: GovernorConfig,
        pressure: PressurePolicy,
        events: EventBus,
        park: Callable[..., None],  # Governor.park(lease, reason=...)
    ) -> None:
        self.backend = backend
        self.config = config
        self.pressure = pressure
        self.events = events
        self._park = park
        self._lock = threading.RLock()  # retention state; backend calls happen under it
        self._idle: dict[Lease, _Idle] = {}
        self._holding: set[Lease] = set()  # leases whose KV is held (resident or offloaded)
        self._expiry: dict[Lease, Deadline] = {}  # when each hold ends, tool over or not
        self._holds = 0  # numbers each hold, so a deadline fires only for its own
        self._deadlines = Deadlines()

    # -- an idle period ---------------------------------------------------------------
    def needs_backend(self, lease: Lease, *, budget_open: bool) -> bool:
        """Whether ``begin`` for this lease calls the backend (to hold its KV)."""
        return budget_open and lease.num_calls > 0 and self.config.retain_s > 0

    def begin(
        self,
        lease: Lease,
        *,
        reason: str,
        budget_open: bool,
        expected_s: float | None = None,
        hold_kv: bool = True,
    ) -> None:
        """The lease waits on a tool (``reason="tool"``) or its children, or its agent is
        between model calls (``"turn"``, ``hold_kv=False``: parked in time, KV not held)."""
        config = self.config
        with self._lock:
            self._end_locked(lease)
            idle = _Idle(reason)
            self._idle[lease] = idle
            worth_holding = hold_kv and (expected_s is None or expected_s <= config.retain_s)
            if self.needs_backend(lease, budget_open=budget_open) and worth_holding:
                self._retain(lease)
            if config.park_after_s > 0:
                idle.timers.append(self._timer(config.park_after_s, self._park_idle, lease, idle))
        if config.park_after_s == 0:
            self._park(lease, reason=reason)
        if lease.num_retained_blocks:
            self.relieve()

    def end(self, lease: Lease) -> None:
        """The wait is over (the tool returned); the KV stays held until the next call."""
        if lease not in self._idle:
            return
        with self._lock:
            self._end_locked(lease)

    def has_work_before_call(self, lease: Lease) -> bool:
        """Whether ``before_call`` has anything to do (it calls the backend if so)."""
        return bool(self._holding) or lease in self._idle

    def before_call(self, lease: Lease) -> None:
        """The lease is about to call the model: make room, bring its KV back, and let
        the engine hand the held blocks to the call."""
        with self._lock:
            self._end_locked(lease)
        self.relieve(exclude=lease)
        with self._lock:
            if lease.kv_offloaded:
                blocks = lease.num_retained_tokens // lease.block_size
                self.backend.restore(budget=lease.budget)
                lease.kv_offloaded = False
                self._publish("restored", lease, blocks=blocks)
            self._holding.discard(lease)
            self._set_expiry(lease, None)
            lease.num_retained_tokens = 0

    def forget(self, lease: Lease) -> None:
        """The lease is released: its budget closes, and the hold with it."""
        with self._lock:
            self._end_locked(lease)
            self._holding.discard(lease)
            self._set_expiry(lease, None)
            lease.num_retained_tokens = 0
            lease.kv_offloaded = False

    # -- pressure ---------------------------------------------------------------------
    def relieve(self, *, exclude: Lease | None = None) -> int:
        """Offload held KV while blocks in use exceed the watermark; blocks freed."""
        with self._lock:
            candidates = [
                lease
                for lease in self._holding
                if lease is not exclude and lease.num_retained_blocks
            ]
            if not candidates:
                return 0
            m = self.backend.metrics()
            num_blocks = m.num_blocks_in_use + m.num_blocks_free
            needed = m.num_blocks_in_use - math.floor(num_blocks * self.config.pressure_watermark)
            if needed <= 0:
                return 0
            self._publish(
                "pressure",
                None,
                blocks_in_use=m.num_blocks_in_use,
                num_blocks=num_blocks,
                blocks_needed=needed,
            )
            freed = 0
            for choice in self.pressure.choose(candidates, num_blocks_needed=needed):
                lease = choice.lease
                if lease not in self._holding or not lease.num_retained_blocks:
                    continue  # a policy that names a lease twice, or one not offered
                blocks = lease.num_retained_blocks
                try:
                    self.backend.offload(budget=lease.budget)
                except BackendError as exc:  # no host room: let the prefix cache keep it
                    self._drop(lease, f"{choice.reason}; not offloaded: {exc}")
                else:
                    lease.kv_offloaded = True
                    self._publish("offloaded", lease, blocks=blocks, reason=choice.reason)
                freed += blocks
                if freed >= needed:
                    break
            return freed

    # -- under the lock -----------------------------------------------------------------
    def _retain(self, lease: Lease) -> None:
        tokens = self.backend.retain(budget=lease.budget)
        lease.num_retained_tokens = tokens
        lease.kv_offloaded = False
        if tokens:
            self._holding.add(lease)
            self._holds += 1
            deadline = self._timer(self.config.retain_s, self._expire, lease, self._holds)
            self._set_expiry(lease, deadline)
            self._publish("retained", lease, tokens=tokens)

    def _set_expiry(self, lease: Lease, deadline: Deadline | None) -> None:
        old = self._expiry.pop(lease, None)
        if old is not None:
            old.cancel()
        if deadline is not None:
            self._expiry[lease] = deadline

    def _drop(self, lease: Lease, reason: str) -> None:
        blocks = lease.num_retained_blocks
        self.backend.release_retained(budget=lease.budget)
        self._holding.discard(lease)
        self._set_expiry(lease, None)
        lease.num_retained_tokens = 0
        lease.kv_offloaded = False
        self._publish("dropped", lease, blocks=blocks, reason=reason)

    def _end_locked(self, lease: Lease) -> None:
        idle = self._idle.pop(lease, None)
        if idle is not None:
            for timer in idle.timers:
                timer.cancel()

    def _expire(self, lease: Lease, number: int) -> None:
        """``retain_s`` is up, whether or not the tool has returned: a hold still on the
        device goes back to the prefix cache (an offloaded one costs no device blocks and
        waits for the next call). A lease parked after its tool, queued behind others,
        must not keep blocks the running ones need."""
        with self._lock:
            deadline = self._expiry.get(lease)
            if lease not in self._holding or deadline is None or deadline.args[1] != number:
                return
            self._expiry.pop(lease, None)
            if not lease.kv_offloaded and lease.state is not LeaseState.RELEASED:
                self._drop(lease, f"held for retain_s={self.config.retain_s:g} s")

    def _park_idle(self, lease: Lease, idle: _Idle) -> None:
        with self._lock:
            if self._idle.get(lease) is not idle:
                return
        self._park(lease, reason=idle.reason)

    def _timer(self, seconds: float, fn: Callable[..., None], *args: object) -> Deadline:
        return self._deadlines.call_later(seconds, fn, *args)

    def _publish(self, kind: str, lease: Lease | None, **attributes: object) -> None:
        if not self.events.active:
            return
        self.events.publish(
            GovernorEvent(
                kind,
                lease_id=None if lease is None else lease.lease_id,
                agent=None if lease is None else lease.agent.name,
                tenant=None if lease is None else lease.tenant,
                run_id=None if lease is None else lease.run_id,
                attributes=attributes,
            )
        )
