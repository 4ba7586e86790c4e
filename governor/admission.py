"""Admission control: which leases may be active at once, from the backend's real capacity.

A synchronous core under one lock, the last in the governor's lock order
(docs/design/lock-order.md): nothing is called under it but the policy and the waiters'
wake-ups. Waiting leases are tried in the policy's order; one blocked by memory holds the
line, one blocked only by a per-agent or per-tenant cap lets later leases pass.
``guaranteed``: active ceilings plus the KV idle leases hold on the device fit within
``floor(available_blocks * safety_factor)``, and nothing is preempted; ``overcommit``: live
use times ``1 + headroom_ratio`` fits. Pinned prefix blocks count once. A policy that
answers wrongly fails the pass with ``ConfigError`` and leaves the queue as it was.

The modes, a pass over the queue, placement on replicas: docs/design/admission.md.
"""

from __future__ import annotations

import bisect
import reprlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from governor.admission_base import AdmissionBase
from governor.admission_policy import (
    AdmissionPolicy,
    PriorityWithAging,
    check_policy,
    checked_order,
    order_error,
)
from governor.clock import SYSTEM_CLOCK, Clock
from governor.config import AdmissionMode, GovernorConfig
from governor.errors import AdmissionRejected
from governor.lease import Lease, LeaseState
from governor.sizing import blocks_per_seq
from governor.wakeup import Waiter

__all__ = ["AdmissionController", "Waiter"]


@dataclass(slots=True, eq=False)
class _Queued:
    lease: Lease
    waiter: Waiter
    rank: Any = None  # the policy's key(lease), where it offers one
    previous: LeaseState = LeaseState.WAITING  # its state before it queued


class AdmissionController(AdmissionBase):
    """``policy`` orders the waiting leases; None is ``PriorityWithAging`` at the
    config's ``aging_s`` (another policy ignores ``aging_s`` unless it takes it).
    ``clock``: the governor's (``governor.clock``), read for ``queued_at``,
    ``admitted_at`` and the policy's ``now``."""

    def __init__(
        self,
        *,
        config: GovernorConfig,
        available_blocks: int,
        block_size: int,
        policy: AdmissionPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(config=config, available_blocks=available_blocks, block_size=block_size)
        self._policy = PriorityWithAging(aging_s=config.aging_s) if policy is None else policy
        check_policy(self._policy)
        self._key = _static_key(self._policy)
        self._lock = threading.Lock()
        # In the order queued, which the policy orders each pass; or, where the policy has
        # a key, kept in its order (admission_policy's docstring).
        self._queue: list[_Queued] = []
        self._waiting: dict[Lease, _Queued] = {}  # the same, by lease: cancel finds it
        self._active: set[Lease] = set()
        self._reserved = 0  # the own_blocks_reserved of self._active, kept as it changes
        # Device blocks each lease's retained context holds (set_held), and the sum of
        # those of leases not active, which guaranteed mode counts beside _reserved (an
        # active lease's hold is inside its own reservation).
        self._held: dict[Lease, int] = {}
        self._held_idle = 0
        self._room_asked: int | None = None  # _held_idle when asked, until room_made
        self._room_not_made: int | None = None  # _held_idle after a make_room that moved none
        # Where a cap is set, the leases per agent name (per tenant), kept likewise: the
        # active ones, which a verdict compares with the cap (counting them on each verdict
        # made a pass cost the waiting times the active), and the waiting ones (tenant
        # None too), so a pass stops once the cap holds back every one of them.
        self._by_agent = config.max_per_agent is not None
        self._by_tenant = config.max_per_tenant is not None
        self._per_agent: dict[str, int] = {}
        self._per_tenant: dict[str | None, int] = {}  # None is never counted
        self._waiting_agents: dict[str, int] = {}
        self._waiting_tenants: dict[str | None, int] = {}
        self._peak_active = 0
        self._clock = clock

    @property
    def policy(self) -> AdmissionPolicy:
        """The order waiting leases are tried in. Setting it tries them again at once in
        the new order; when that pass fails, the previous policy stays and the error rises."""
        return self._policy

    @policy.setter
    def policy(self, policy: AdmissionPolicy) -> None:
        check_policy(policy)
        with self._lock:
            previous = self._policy, self._key, list(self._queue)
            ranks = [queued.rank for queued in self._queue]
            self._policy, self._key = policy, _static_key(policy)
            try:
                if self._key is not None:
                    for queued in self._queue:
                        queued.rank = self._key(queued.lease)
                    self._queue.sort(key=_rank)
                self._pump()
            except BaseException:
                self._policy, self._key, self._queue = previous
                for queued, rank in zip(self._queue, ranks, strict=True):
                    queued.rank = rank
                raise

    def set_available_blocks(self, available_blocks: int) -> None:
        """The backend's capacity changed (a prefix pinned or unpinned)."""
        with self._lock:
            self.available_blocks = available_blocks
            self._pump()

    # -- the queue ------------------------------------------------------------------
    def enqueue(self, lease: Lease, waiter: Waiter) -> None:
        """Queue the lease; its waiter wakes once it is ACTIVE (maybe at once)."""
        with self._lock:
            previous, previous_queued_at = lease.state, lease.queued_at
            lease.queued_at = self._clock.now()  # aging counts from here, not from its request
            queued = _Queued(lease, waiter, None if self._key is None else self._key(lease))
            queued.previous = previous
            lease.state = LeaseState.WAITING
            if self._key is None:
                self._queue.append(queued)
            else:
                bisect.insort(self._queue, queued, key=_rank)
            self._add_waiting(queued)
            try:
                self._pump()
            except BaseException:  # the policy failed: nobody waits for this lease
                if self._waiting.get(lease) is queued:
                    self._queue.remove(queued)
                    self._discard_waiting(lease)
                    lease.state, lease.queued_at = previous, previous_queued_at
                raise

    def cancel(self, lease: Lease) -> bool:
        """Take a waiting lease off the queue. False when it was admitted meanwhile: the
        caller then owns an active lease and must release it. A lease never admitted is
        RELEASED; one queued again after parking is PARKED again, still its owner's to
        release (its budget and held KV are returned then)."""
        with self._lock:
            queued = self._waiting.get(lease)
            if queued is None:
                return False
            self._queue.remove(queued)
            self._discard_waiting(lease)
            again = queued.previous is not LeaseState.WAITING and lease.admitted_at is not None
            lease.state = LeaseState.PARKED if again else LeaseState.RELEASED
            self._pump()  # it may have held the line for others
            return True

    def release(self, lease: Lease) -> None:
        with self._lock:
            queued = self._waiting.get(lease)
            if queued is not None:
                self._queue.remove(queued)
                self._discard_waiting(lease)
            self._discard_active(lease)
            self._held_idle -= self._held.pop(lease, 0)
            lease.state = LeaseState.RELEASED
            if queued is not None:  # released while queued: its waiter wakes to find out
                queued.waiter.wake()
            self._pump()

    def park(self, lease: Lease, *, ceiling_tokens: int | None = None) -> bool:
        """Park an active lease (True), at a new ceiling when given; False when it was
        not active (a new ceiling is set all the same, unless it is queued)."""
        with self._lock:
            parked = lease.state is LeaseState.ACTIVE
            if parked:
                self._discard_active(lease)
                lease.state = LeaseState.PARKED
            if ceiling_tokens is not None and lease not in self._waiting:
                lease.ceiling_tokens = ceiling_tokens
            if parked:
                self._pump()
            return parked

    def try_grow(self, lease: Lease, ceiling_tokens: int) -> bool:
        """Raise an active lease's ceiling when that fits now; False when it must queue.
        Raises ``AdmissionRejected`` when the larger ceiling can never fit. The ceiling
        of an active lease changes only here, under the lock, out of the ledger and
        back in, so a concurrent park or release never subtracts a reservation that
        was not added."""
        own = blocks_per_seq(ceiling_tokens, self.block_size) - lease.prefix_blocks
        if own > self._most_blocks():
            raise AdmissionRejected(
                ceiling_tokens, self._most_tokens(lease), agent=lease.agent.name
            )
        with self._lock:
            if lease.state is not LeaseState.ACTIVE:
                return False
            old = lease.ceiling_tokens
            self._discard_active(lease)
            lease.ceiling_tokens = ceiling_tokens
            fits = self._verdict(lease) == "ok"
            if not fits:
                lease.ceiling_tokens = old
            self._add_active(lease)
            return fits

    def set_held(self, lease: Lease, num_blocks: int) -> None:
        """The device blocks the lease's retained context holds now (0: none, or moved
        to host memory); its shared prefix's pinned blocks are left out. Guaranteed mode
        counts them while the lease is not active."""
        with self._lock:
            if lease.state is LeaseState.RELEASED:
                num_blocks = 0
            num_blocks = max(0, num_blocks - lease.prefix_blocks)  # the pins are not in it
            old = self._held.pop(lease, 0)
            if num_blocks > 0:
                self._held[lease] = num_blocks
            if lease not in self._active:
                self._held_idle += num_blocks - old
                if num_blocks < old:
                    self._pump()  # room made: try the waiting leases again

    def room_made(self) -> None:
        """The holds ``make_room`` asked for were moved (or could not be): try again."""
        with self._lock:
            moved = self._held_idle != self._room_asked
            self._room_not_made = None if moved else self._held_idle
            self._room_asked = None
            self._pump()

    def ledger(self) -> tuple[int, int, int, int]:
        """The reservations of the active leases and the blocks held by leases not
        active, each as kept and as summed over the leases now (the pairs are equal)."""
        with self._lock:
            reserved = sum(lease.own_blocks_reserved for lease in self._active)
            held = sum(b for lease, b in self._held.items() if lease not in self._active)
            return self._reserved, reserved, self._held_idle, held

    def counts(self) -> tuple[int, int, int]:
        """Active leases, waiting leases, peak active so far."""
        with self._lock:
            return len(self._active), len(self._queue), self._peak_active

    def blocks_committed(self) -> int:
        with self._lock:
            return self._committed()

    # -- decisions (under the lock) ---------------------------------------------------
    def _pump(self) -> None:
        if not self._queue:
            return
        admitted: list[_Queued] = []
        changed = True  # admitted since _all_capped was last asked (only that can change it)
        for queued in self._ordered():
            verdict = self._verdict(queued.lease)
            if verdict == "memory":
                self._ask_for_room(queued.lease)
                break
            if verdict == "ok":
                self._admit(queued.lease)
                admitted.append(queued)
                changed = True
            elif changed:
                changed = False
                if self._all_capped():  # nobody behind it can pass either
                    break
        for queued in admitted:
            self._queue.remove(queued)
            self._discard_waiting(queued.lease)
            queued.waiter.wake()

    def _ask_for_room(self, lease: Lease) -> None:
        """Guaranteed mode, ``lease`` first in line and held out by memory: when moving
        the holds of leases not active would let it in, ask for that (once at a time)."""
        held = self._held_idle
        if self._room_asked is not None or self.make_room is None or not held:
            return
        if self.config.mode is not AdmissionMode.GUARANTEED or held == self._room_not_made:
            return  # not asked twice for the same holds: they could not be moved
        needed = self._reserved + held + lease.own_blocks_reserved - self.limit_blocks
        if 0 < needed <= held:
            self._room_asked = held
            self.make_room(needed)

    def _all_capped(self) -> bool:
        """Whether a cap holds back every waiting lease now: every waiting lease's agent
        is at ``max_per_agent``, or every one's tenant at ``max_per_tenant``. Leases
        admitted in the pass still count as waiting here, which can only say no."""
        config = self.config
        cap = config.max_per_agent
        per_agent = self._per_agent
        if cap is not None and all(per_agent.get(a, 0) >= cap for a in self._waiting_agents):
            return True
        cap = config.max_per_tenant
        return (
            cap is not None
            and None not in self._waiting_tenants
            and all(self._per_tenant.get(t, 0) >= cap for t in self._waiting_tenants)
        )

    def _ordered(self) -> list[_Queued]:
        """The queue in the policy's order, checked to be exactly the waiting leases."""
        if self._key is not None:
            return self._queue  # kept in order as leases arrive; _pump changes it after
        waiting = self._waiting  # by lease, in the order queued
        answer = self._policy.order(
            list(waiting), active=frozenset(self._active), now=self._clock.now()
        )
        if not isinstance(answer, Iterable):
            raise order_error(self._policy, f"it returned {reprlib.repr(answer)}")
        items = list(answer)
        try:  # the answer as it should be: each waiting lease once (leases are equal by id)
            ordered = [waiting[item] for item in items]
        except (KeyError, TypeError):  # not a waiting lease: say which
            return checked_order(self._policy, waiting, items)
        if len(ordered) == len(waiting) == len(set(map(id, ordered))):
            return ordered
        return checked_order(self._policy, waiting, items)  # one left out or twice: say which

    def _verdict(self, lease: Lease) -> str:
        config = self.config
        if config.max_concurrent is not None and len(self._active) >= config.max_concurrent:
            return "memory"
        cap = config.max_per_agent
        if cap is not None and self._per_agent.get(lease.agent.name, 0) >= cap:
            return "cap"
        cap = config.max_per_tenant
        if cap is not None and self._per_tenant.get(lease.tenant, 0) >= cap:  # None: no cap
            return "cap"
        if config.mode is AdmissionMode.GUARANTEED:
            fits = self._committed() + lease.own_blocks_reserved <= self.limit_blocks
            if fits and self.placement is not None:
                fits = self.placement.can_place(lease.budget, lease.own_blocks_reserved)
        else:
            # Its context's blocks held on the device are in use whether it runs or
            # waits (refusing it frees none of them): it is charged only the rest.
            live = self._committed() + max(1, lease.blocks_charged - self._held.get(lease, 0))
            fits = live * (1 + config.headroom_ratio) <= self.limit_blocks
            # The headroom is for the growth of leases run at once; with none active a
            # lease whose context fits runs, since nothing else could make room for it.
            fits = fits or (not self._active and live <= self.limit_blocks)
        return "ok" if fits else "memory"

    def _committed(self) -> int:
        if self.config.mode is AdmissionMode.GUARANTEED:
            return self._reserved + self._held_idle
        return sum(lease.blocks_charged for lease in self._active)

    def _admit(self, lease: Lease) -> None:
        lease.state = LeaseState.ACTIVE
        if lease.admitted_at is None:
            lease.admitted_at = self._clock.now()
        self._add_active(lease)
        self._peak_active = max(self._peak_active, len(self._active))

    # An active lease's ceiling (so its reservation) changes only in try_grow, which
    # takes it out of the set first and puts it back after.
    def _add_active(self, lease: Lease) -> None:
        self._active.add(lease)
        self._reserved += lease.own_blocks_reserved
        placement = self._placement()
        if placement is not None:
            placement.place(lease.budget, lease.own_blocks_reserved)
        self._held_idle -= self._held.get(lease, 0)  # its hold is in its reservation now
        if self._by_agent:
            _add(self._per_agent, lease.agent.name, 1)
        if self._by_tenant and lease.tenant is not None:
            _add(self._per_tenant, lease.tenant, 1)

    def _discard_active(self, lease: Lease) -> None:
        if lease in self._active:
            self._active.remove(lease)
            self._reserved -= lease.own_blocks_reserved
            placement = self._placement()
            if placement is not None:
                placement.unplace(lease.budget)
            self._held_idle += self._held.get(lease, 0)
            if self._by_agent:
                _add(self._per_agent, lease.agent.name, -1)
            if self._by_tenant and lease.tenant is not None:
                _add(self._per_tenant, lease.tenant, -1)

    def _add_waiting(self, queued: _Queued) -> None:
        lease = queued.lease
        self._waiting[lease] = queued
        if self._by_agent:
            _add(self._waiting_agents, lease.agent.name, 1)
        if self._by_tenant:
            _add(self._waiting_tenants, lease.tenant, 1)

    def _discard_waiting(self, lease: Lease) -> None:
        del self._waiting[lease]
        if self._by_agent:
            _add(self._waiting_agents, lease.agent.name, -1)
        if self._by_tenant:
            _add(self._waiting_tenants, lease.tenant, -1)


def _static_key(policy: AdmissionPolicy) -> Callable[[Lease], Any] | None:
    key = getattr(policy, "key", None)
    return key if callable(key) else None


def _add(counts: dict[Any, int], name: object, change: int) -> None:
    """``counts[name] += change``; a name at none is dropped, so the counts stay small."""
    count = counts.get(name, 0) + change
    if count:
        counts[name] = count
    else:
        del counts[name]


def _rank(queued: _Queued) -> Any:
    return queued.rank
