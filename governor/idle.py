"""Idle agents: parking, KV retention between calls, offload under pressure, restore.

While an agent waits on a tool or on its children it is parked after ``park_after_s``, its
context's KV held for up to ``retain_s``, offloaded to host memory under pressure (or, in
guaranteed mode, when its hold alone keeps a lease waiting) and restored before its next
call. Deadlines run on the governor's clock; each idle period is its own object, so a
deadline that fires as its wait ends does nothing. Events are published outside the locks.

The steps in full: docs/design/lease-life.md. What ``_backend`` and ``_lock`` guard, and
where they sit in the governor's lock order: docs/design/lock-order.md.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from governor.backend import Backend, BackendMetrics
from governor.clock import SYSTEM_CLOCK, Clock, Timer
from governor.config import GovernorConfig
from governor.errors import BackendError
from governor.events import LeaseEvents
from governor.lease import Lease, LeaseState
from governor.pressure import PressurePolicy
from governor.unwaited import UnwaitedErrors

__all__ = ["IdleKeeper"]

_BY_ENGINE = "by the engine: a running request needed its blocks"


@dataclass(slots=True, eq=False)
class _Idle:
    reason: str
    timers: list[Timer] = field(default_factory=list)


class IdleKeeper:
    def __init__(
        self,
        *,
        backend: Backend,
        config: GovernorConfig,
        pressure: PressurePolicy,
        events: LeaseEvents,
        park: Callable[[Lease], bool],  # the admission controller's park: True if it parked
        held: Callable[[Lease, int], None] = lambda lease, blocks: None,  # device blocks held
        room_made: Callable[[], None] = lambda: None,  # make_room is done
        unwaited: UnwaitedErrors | None = None,  # where a deferred hold's error goes
        clock: Clock = SYSTEM_CLOCK,  # its deadlines are armed on it
    ) -> None:
        self.backend = backend
        self.config = config
        self.pressure = pressure
        self.events = events
        self._park = park
        self._held = held
        self._room_made = room_made
        self.unwaited = unwaited or UnwaitedErrors()
        self._backend = threading.RLock()  # backend calls; threads only (module docstring)
        self._lock = threading.Lock()  # the state below; never held across a backend call
        self._idle: dict[Lease, _Idle] = {}
        self._holding: set[Lease] = set()  # leases whose KV is held (resident or offloaded)
        self._busy: dict[Lease, _Idle] = {}  # a hold being made: their next call waits for it
        # When each hold ends, tool over or not, and the number of the hold it ends.
        self._expiry: dict[Lease, tuple[Timer, int]] = {}
        self._holds = 0  # numbers each hold, so a deadline fires only for its own
        self.clock = clock
        held_contexts = getattr(backend, "held_contexts", None)  # the engine's own moves
        self._engine_holds = held_contexts if callable(held_contexts) else None
        self._reclaims_seen = 0  # the backend's num_holds_reclaimed when last read

    @property
    def backend_lock(self) -> threading.RLock:
        """Held around a budget's ``close_budget`` (threads only: module docstring)."""
        return self._backend

    # -- an idle period ---------------------------------------------------------------
    @property
    def holds_at_finish(self) -> bool:
        """Whether a call asks the backend to hold its context as it finishes
        (``GenerationRequest.retain``, where the backend ``retains_at_finish``): on a full
        pool another request's allocation could evict it before ``begin`` holds it.
        ``begin`` keeps that hold or ends it; a call with no idle period after it hands
        it to the next call, and the lease's release ends it."""
        return self.config.retain_s > 0 and getattr(self.backend, "retains_at_finish", False)

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
        park_now: bool = False,
        defer_hold: bool = False,
    ) -> None:
        """The lease waits on a tool (``reason="tool"``) or its children, or its agent is
        between model calls (``"turn"``, ``hold_kv=False``: parked in time, KV not held).

        ``park_now`` parks it at once; ``defer_hold`` holds its KV on the deadline
        thread, so a caller that must not wait on the engine (an event loop, a fan-out
        hook) never does; otherwise the hold is made here."""
        config = self.config
        worth_holding = hold_kv and (expected_s is None or expected_s <= config.retain_s)
        # A wait expected past retain_s is not worth device blocks, but its context is
        # still worth host memory: restored before the next call, it is not computed again
        # (a 16k-token context is a second or more of prefill on a consumer card, and a
        # copy of tens of milliseconds over PCIe). With no host room it is dropped, as
        # every hold is that cannot be offloaded.
        to_host = hold_kv and not worth_holding
        hold = (worth_holding or to_host) and self.needs_backend(lease, budget_open=budget_open)
        with self._lock:
            self._end_locked(lease)
            idle = _Idle(reason)
            self._idle[lease] = idle
            if hold:
                self._busy[lease] = idle
            if config.park_after_s > 0 and not park_now:
                idle.timers.append(self._timer(config.park_after_s, self._park_idle, lease, idle))
        held = False
        if hold and defer_hold:
            self._timer(0, self._hold_deferred, lease, idle, to_host)
        elif hold:
            held = self._hold(lease, idle, False)
            if held and to_host:
                self._to_host(lease, self._long_wait)
        elif lease.retained_at_finish and self.needs_backend(lease, budget_open=budget_open):
            if defer_hold:  # the last call's hold, not kept: ended
                self._timer(0, self._end_hold_at_finish, lease, True)
            else:
                self._end_hold_at_finish(lease, False)
        if park_now or config.park_after_s == 0:
            self._park_idle(lease, idle)
        if held:
            self.relieve()

    def end(self, lease: Lease) -> None:
        """The wait is over (the tool returned); the KV stays held until the next call."""
        if lease not in self._idle:
            return
        with self._lock:
            self._end_locked(lease)

    def has_work_before_call(self, lease: Lease) -> bool:
        """Whether ``before_call`` has anything to do (it calls the backend if so)."""
        return bool(self._holding) or lease in self._idle or lease in self._busy

    def before_call(self, lease: Lease) -> None:
        """The lease is about to call the model: make room, bring its KV back, and let
        the engine hand the held blocks to the call. On a thread: it waits for a hold
        being made for the lease, and for the engine."""
        with self._backend:
            self.end(lease)
            self.relieve(exclude=lease)
            with self._lock:
                restore = lease in self._holding and lease.kv_offloaded
                blocks = lease.num_retained_tokens // lease.block_size
            if restore and not getattr(self.backend, "restores_at_call", False):
                self.backend.restore(budget=lease.budget)
            with self._lock:
                self._clear_hold(lease)
        if restore:
            self.events.publish("restored", lease, blocks=blocks)

    def forget(self, lease: Lease) -> None:
        """The lease is released: its budget closes, and the hold with it."""
        with self._lock:
            self._end_locked(lease)
            self._clear_hold(lease)

    def lost(self, reason: str, *, budgets: Collection[str] | None = None) -> None:
        """Every hold is gone without a backend call (the backend restarted and lost its
        KV), or those of ``budgets`` (one replica of several did): forget them, so that
        admission stops counting blocks nobody holds."""
        with self._lock:
            lost = [
                (lease, lease.num_retained_blocks)
                for lease in self._holding
                if budgets is None or lease.budget in budgets
            ]
            for lease, _ in lost:
                self._clear_hold(lease)
        for lease, blocks in lost:
            self.events.publish("dropped", lease, blocks=blocks, reason=reason)

    # -- pressure ---------------------------------------------------------------------
    def relieve(self, *, exclude: Lease | None = None) -> int:
        """Offload held KV while blocks in use exceed the watermark; blocks freed. On a
        thread (it calls the backend)."""
        with self._backend:
            with self._lock:
                candidates = [
                    lease
                    for lease in self._holding
                    if lease is not exclude and lease.num_retained_blocks
                ]
            if not candidates:
                return 0
            m = self.backend.metrics()
            if self._reconcile(m):
                with self._lock:
                    candidates = [lease for lease in candidates if lease.num_retained_blocks]
            num_blocks = m.num_blocks_in_use + m.num_blocks_free
            needed = m.num_blocks_in_use - math.floor(num_blocks * self.config.pressure_watermark)
            if needed <= 0:
                return 0
            self.events.publish(
                "pressure",
                None,
                blocks_in_use=m.num_blocks_in_use,
                num_blocks=num_blocks,
                blocks_needed=needed,
            )
            return self._move(candidates, needed)

    def make_room(self, num_blocks: int) -> None:
        """Guaranteed mode: a waiting lease fits only once leases not active stop holding
        ``num_blocks`` device blocks. Their holds are offloaded (or dropped) on the
        deadline thread; this only schedules that, so the admission lock may call it."""
        self._timer(0, self._make_room, num_blocks)

    def _make_room(self, needed: int) -> None:
        try:
            with self._backend:
                if self._engine_holds is not None:
                    self._reconcile(self.backend.metrics())
                with self._lock:
                    candidates = [
                        lease
                        for lease in self._holding
                        if lease.state is not LeaseState.ACTIVE and lease.num_retained_blocks
                    ]
                if candidates:
                    self._move(candidates, needed)
        finally:
            self._room_made()

    def _reconcile(self, m: BackendMetrics) -> bool:
        """Holds the engine gave up itself since the last look (under ``_backend``): a
        running request needed their blocks, so it moved them to host memory, or ended
        them (no host room). Counted and reported as the governor's own offloads and
        drops are; True if any was. Read only when the engine's count of them moved. A
        hold is recorded here only once the backend made it, and every state read after
        that is as late, so a hold is never taken for gone too early."""
        read = self._engine_holds
        if read is None or m.num_holds_reclaimed == self._reclaims_seen:
            return False
        with self._lock:
            if all(lease.kv_offloaded for lease in self._holding):
                return False
        states = read()
        self._reclaims_seen = m.num_holds_reclaimed
        moved: list[tuple[str, Lease, int]] = []
        with self._lock:
            for lease in [h for h in self._holding if not h.kv_offloaded]:
                offloaded, blocks = states.get(lease.budget), lease.num_retained_blocks
                if offloaded is None:
                    self._clear_hold(lease)
                    moved.append(("dropped", lease, blocks))
                elif offloaded:
                    lease.kv_offloaded = True
                    self._held(lease, 0)
                    moved.append(("offloaded", lease, blocks))
        for kind, lease, blocks in moved:
            self.events.publish(kind, lease, blocks=blocks, reason=_BY_ENGINE)
        return bool(moved)

    def _move(self, candidates: list[Lease], needed: int) -> int:
        """Offload the holds the pressure policy picks until ``needed`` blocks are freed
        (under ``_backend``); blocks freed."""
        freed = 0
        for choice in self.pressure.choose(candidates, num_blocks_needed=needed):
            lease = choice.lease
            with self._lock:
                blocks = lease.num_retained_blocks if lease in self._holding else 0
            if not blocks:
                continue  # a policy that names a lease twice, one not offered, or gone
            try:
                self.backend.offload(budget=lease.budget)
            except BackendError as exc:  # no host room: let the prefix cache keep it
                self._drop(lease, f"{choice.reason}; not offloaded: {exc}")
            else:
                with self._lock:
                    if lease in self._holding:
                        lease.kv_offloaded = True
                        self._held(lease, 0)
                self.events.publish("offloaded", lease, blocks=blocks, reason=choice.reason)
            freed += blocks
            if freed >= needed:
                break
        return freed

    # -- holds (under _backend) ---------------------------------------------------------
    @property
    def _long_wait(self) -> str:
        return f"its wait is expected past retain_s={self.config.retain_s:g} s"

    def _to_host(self, lease: Lease, reason: str) -> None:
        """Offload the lease's hold now, for ``reason``; with no host room, drop it to
        the prefix cache."""
        with self._backend:
            with self._lock:
                resident = lease in self._holding and not lease.kv_offloaded
                blocks = lease.num_retained_blocks if resident else 0
            if not blocks:
                return
            try:
                self.backend.offload(budget=lease.budget)
            except BackendError as exc:  # no host room: let the prefix cache keep it
                self._drop(lease, f"{reason}; not offloaded: {exc}")
                return
            with self._lock:
                if lease in self._holding:
                    lease.kv_offloaded = True
                    self._held(lease, 0)
        self.events.publish("offloaded", lease, blocks=blocks, reason=reason)

    def _hold_deferred(self, lease: Lease, idle: _Idle, to_host: bool) -> None:
        """``_hold`` on the deadline thread (a timer's callback returns nothing)."""
        self._hold(lease, idle, True, to_host)

    def _hold(self, lease: Lease, idle: _Idle, deferred: bool, to_host: bool = False) -> bool:
        """Hold the lease's KV for this idle period, unless the period is over already;
        True when held. Deferred (on the deadline thread), a hold the backend refuses is
        not made (it saves a recompute, nobody waits for it; its error is counted in
        ``unwaited``), and pressure is relieved here; otherwise by the caller. A context
        the backend held as the call finished is kept as it is: no backend call."""
        try:
            with self._backend:
                with self._lock:
                    current = self._idle.get(lease) is idle and lease.released_at is None
                    tokens, lease.retained_at_finish = lease.retained_at_finish, 0
                try:
                    if current and not tokens:
                        tokens = self.backend.retain(budget=lease.budget)
                except BackendError as exc:
                    if not deferred:
                        raise
                    self.unwaited.record(f"retain(budget={lease.budget!r})", exc)
                with self._lock:
                    recorded = tokens > 0 and lease.released_at is None
                    if recorded:
                        self._holds += 1
                        expiry = self._timer(self.config.retain_s, self._expire, lease, self._holds)
                        self._set_expiry(lease, (expiry, self._holds))
                        self._holding.add(lease)
                        lease.num_retained_tokens = tokens
                        lease.kv_offloaded = False
                        self._held(lease, lease.num_retained_blocks)
            if recorded:
                self.events.publish("retained", lease, tokens=tokens)
                if deferred and to_host:
                    self._to_host(lease, self._long_wait)
                elif deferred:
                    self.relieve()
            return recorded
        finally:
            with self._lock:
                if self._busy.get(lease) is idle:
                    del self._busy[lease]

    def _end_hold_at_finish(self, lease: Lease, deferred: bool) -> None:
        """A hold the last call made as it finished, not kept for this idle period: its
        blocks go back to the prefix cache. Deferred, an error is counted in ``unwaited``
        (the hold then ends with the budget's next call or its close)."""
        with self._backend:
            with self._lock:
                held, lease.retained_at_finish = lease.retained_at_finish, 0
                kept = lease in self._holding or lease.released_at is not None
            if kept or not held:
                return
            try:
                self.backend.release_retained(budget=lease.budget)
            except BackendError as exc:
                if not deferred:
                    raise
                self.unwaited.record(f"release_retained(budget={lease.budget!r})", exc)

    def _drop(self, lease: Lease, reason: str) -> None:
        """Let a hold go back to the prefix cache (under ``_backend``)."""
        with self._lock:
            blocks = lease.num_retained_blocks
        self.backend.release_retained(budget=lease.budget)
        with self._lock:
            self._clear_hold(lease)
        self.events.publish("dropped", lease, blocks=blocks, reason=reason)

    def _expire(self, lease: Lease, number: int) -> None:
        """``retain_s`` is up, whether or not the tool has returned: a hold still on the
        device goes to host memory, or with no host room back to the prefix cache (an
        offloaded one costs no device blocks and waits for the next call). A lease parked
        after its tool, queued behind others, must not keep blocks the running ones need;
        its context is still worth a copy rather than a prefill again (Continuum's
        reading of a TTL's end, with host memory)."""
        with self._backend:
            with self._lock:
                expiry = self._expiry.get(lease)
                if lease not in self._holding or expiry is None or expiry[1] != number:
                    return
                self._expiry.pop(lease, None)
                move = not lease.kv_offloaded and lease.released_at is None
            if move:
                self._to_host(lease, f"held for retain_s={self.config.retain_s:g} s")

    # -- under _lock ----------------------------------------------------------------------
    def _clear_hold(self, lease: Lease) -> None:
        if lease in self._holding:
            self._held(lease, 0)
        self._holding.discard(lease)
        self._set_expiry(lease, None)
        lease.num_retained_tokens = 0
        lease.kv_offloaded = False

    def _set_expiry(self, lease: Lease, expiry: tuple[Timer, int] | None) -> None:
        old = self._expiry.pop(lease, None)
        if old is not None:
            old[0].cancel()
        if expiry is not None:
            self._expiry[lease] = expiry

    def _end_locked(self, lease: Lease) -> None:
        idle = self._idle.pop(lease, None)
        if idle is not None:
            for timer in idle.timers:
                timer.cancel()

    def _park_idle(self, lease: Lease, idle: _Idle) -> None:
        # Checked and parked under one lock: the lease's next call ends its idle period
        # under it first, so a lease is never parked once that call has begun.
        with self._lock:
            parked = self._idle.get(lease) is idle and self._park(lease)
        if parked:
            self.events.publish("parked", lease, reason=idle.reason)

    def _timer(self, seconds: float, fn: Callable[..., None], *args: object) -> Timer:
        return self.clock.call_later(seconds, fn, *args)
