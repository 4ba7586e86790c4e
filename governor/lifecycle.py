"""``LeaseLifecycle``: a lease's life from request to release.

A lease is requested (checked that it can ever fit), acquired, parked and resumed, grown,
and released exactly once whatever its state: its admission room, its held KV and its
engine budget all return then; a cancelled or timed-out waiter leaves no trace. The
lifecycle owns the fan-out limiter and drives the admission controller and idle keeper it
is given. A lease's life: docs/design/lease-life.md.

The governor's lock order is written in one place, docs/design/lock-order.md; this
module's ``_lock`` is fourth in it and nothing is called under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import math
import threading
from collections.abc import Callable
from typing import Any

from governor.admission_base import AdmissionBase
from governor.agent import AgentSpec
from governor.backend import Backend
from governor.clock import Clock
from governor.config import GovernorConfig
from governor.errors import (
    AdmissionTimeout,
    BackendError,
    ConfigError,
    LeaseExpired,
    LeaseReleased,
    StoreUnavailable,
)
from governor.events import LeaseEvents, error_name
from governor.fanout import FanoutLimiter, FanoutSlot
from governor.idle import IdleKeeper
from governor.lease import Lease, LeaseOwner, LeaseState
from governor.runs import current_run_id
from governor.store.reaped import ReapedBudgets
from governor.unwaited import UnwaitedErrors, close_budget_unwaited
from governor.wakeup import Waiter

__all__ = ["LeaseLifecycle"]


class LeaseLifecycle:
    def __init__(
        self,
        *,
        backend: Backend,
        config: GovernorConfig,
        admission: AdmissionBase,
        idle: IdleKeeper,
        events: LeaseEvents,
        unwaited: UnwaitedErrors,
        clock: Clock,
    ) -> None:
        self.backend = backend
        self.config = config
        self.admission = admission
        self.idle = idle
        self.events = events
        self.unwaited = unwaited  # errors of budget closes nobody waited for
        self.clock = clock
        self.fanout = FanoutLimiter(on_first_child=self._park_parent)
        self._ids = itertools.count()
        self._lock = threading.Lock()  # the two below and release marks (lock order: 4)
        self._budgets_open: set[str] = set()
        self._parents: dict[str, Lease] = {}  # lease id -> lease, while it has children
        # Budgets of leases another process lost, for this one to close (a shared store's)
        self.reaped = ReapedBudgets(backend, unwaited, on_closed=admission.budget_closed)
        admission.on_reaped = self.reaped.close_later

    # -- request ----------------------------------------------------------------------
    def request(
        self,
        spec: AgentSpec,
        *,
        ceiling_tokens: int,
        priority: int,
        parent: Lease | None,
        tenant: str | None,
        prefix_blocks: int,
        owner: LeaseOwner,
    ) -> Lease:
        """A new WAITING lease for ``spec``; ``AdmissionRejected`` when its ceiling can
        never fit. Its verbs go to ``owner``."""
        if (
            not isinstance(ceiling_tokens, int)
            or isinstance(ceiling_tokens, bool)
            or ceiling_tokens < 1
        ):
            raise ConfigError.below_minimum("ceiling_tokens", ceiling_tokens, 1)
        number = next(self._ids)
        lease = Lease(
            lease_id=self.admission.lease_id(number),
            agent=spec,
            ceiling_tokens=ceiling_tokens,
            priority=priority,
            block_size=self.admission.block_size,
            arrival=number,
            requested_at=self.clock.now(),
            tenant=tenant,
            parent=parent,
            run_id=current_run_id(),
            governor=owner,
            expected_tokens=math.ceil(ceiling_tokens * self.config.expected_use),
            prefix_blocks=prefix_blocks,
        )
        self.admission.check_can_ever_fit(lease)
        self.events.publish(
            "requested",
            lease,
            ceiling_tokens=ceiling_tokens,
            priority=priority,
            parent_id=None if parent is None else parent.lease_id,
            prefix_blocks=prefix_blocks,
        )
        return lease

    def child_slot(self, parent: Lease, lease: Lease) -> FanoutSlot:
        """One of ``parent``'s fan-out slots for ``lease``; the parent is parked when
        its first child takes one."""
        with self._lock:
            self._parents[parent.lease_id] = parent
        return self.fanout.slot(
            parent.lease_id, parent.agent.max_fanout, timeout_s=self.config.admission_timeout_s
        )

    def _park_parent(self, parent_id: object) -> None:
        # Under the fan-out lock, maybe on an event loop: parked at once (its children
        # need the room), its KV held later on the deadline thread; nothing here waits.
        with self._lock:
            parent = self._parents.get(str(parent_id))
            budget_open = parent is not None and parent.budget in self._budgets_open
        if parent is not None:
            self.idle.begin(
                parent, reason="children", budget_open=budget_open, park_now=True, defer_hold=True
            )

    # -- admission --------------------------------------------------------------------
    def acquire(self, lease: Lease) -> Lease:
        """Wait (blocking this thread) until the lease is ACTIVE."""
        waiter = Waiter()
        started, resumed = self.clock.now(), lease.state is LeaseState.PARKED
        try:
            self.admission.enqueue(lease, waiter)
        except (StoreUnavailable, LeaseExpired) as exc:
            if not resumed:  # never admitted: it ends here, as one that timed out
                self.release(lease, error=exc)
            raise
        if not waiter.wait(self.config.admission_timeout_s) and self.admission.cancel(lease):
            raise AdmissionTimeout(lease.agent.name, self.config.admission_timeout_s)
        self._admitted(lease, started, resumed)
        return lease

    async def aacquire(self, lease: Lease) -> Lease:
        waiter = Waiter(loop=asyncio.get_running_loop())
        started, resumed = self.clock.now(), lease.state is LeaseState.PARKED
        try:
            await self.admission.aenqueue(lease, waiter)
        except (StoreUnavailable, LeaseExpired) as exc:
            if not resumed:  # never admitted: it ends here, as one that timed out
                await self.arelease(lease, error=exc)
            raise
        except asyncio.CancelledError:  # queued or not: a cancel after it finds out
            await self._cancelled(lease, started, resumed)
            raise
        try:
            admitted = await waiter.await_(self.config.admission_timeout_s)
        except asyncio.CancelledError:
            await self._cancelled(lease, started, resumed)
            raise
        if not admitted and await self.admission.acancel(lease):
            raise AdmissionTimeout(lease.agent.name, self.config.admission_timeout_s)
        self._admitted(lease, started, resumed)
        return lease

    async def _cancelled(self, lease: Lease, started: float, resumed: bool) -> None:
        if not await self.admission.acancel(lease):  # admitted as we were cancelled:
            self._publish_admitted(lease, started, resumed)  # its span says both
            await self.arelease(lease, error=asyncio.CancelledError())

    def _admitted(self, lease: Lease, started: float, resumed: bool) -> None:
        self.admission.raise_if_expired(lease)  # woken because its room was given away
        if lease.state is LeaseState.RELEASED:  # released by another thread as it waited
            raise LeaseReleased(lease.lease_id, agent=lease.agent.name)
        self._publish_admitted(lease, started, resumed)

    def _publish_admitted(self, lease: Lease, started: float, resumed: bool) -> None:
        if self.events.active:
            wait_s = self.clock.now() - started
            kind = "resumed" if resumed else "admitted"
            self.events.publish(kind, lease, wait_s=wait_s, ceiling_tokens=lease.ceiling_tokens)

    # -- release ----------------------------------------------------------------------
    def release(self, lease: Lease, *, error: BaseException | None = None) -> None:
        """Return the lease's context, held KV and engine budget, once (a second call
        does nothing). On a shared store the engine budget closes before the room
        returns (``budget_before_room``): another process's lease admitted into that
        room must not find the engine holding both. Blocks on the engine: ``arelease``
        on a loop."""
        if not self._mark_released(lease):
            return
        if self.admission.budget_before_room:
            try:
                self.idle.forget(lease)
                self._close_budget(lease)
            finally:  # its room returns even where the engine failed to close its budget
                try:
                    self.admission.release(lease)
                finally:
                    self._publish_released(lease, error)
            return
        try:
            try:
                self.admission.release(lease)  # a failing admission policy raises here...
            finally:  # ...and the lease's hold is forgotten all the same
                self.idle.forget(lease)
        finally:
            try:
                self._close_budget(lease)
            finally:  # the lease has ended, even where the engine failed to close it
                self._publish_released(lease, error)

    async def arelease(self, lease: Lease, *, error: BaseException | None = None) -> None:
        """``release`` for an event loop: the budget closes on a worker thread, and is
        closed even when this task is cancelled meanwhile. In process the room returns
        before the first wait, so a caller that stops waiting still finds it returned."""
        if not self._mark_released(lease):
            return
        if self.admission.budget_before_room:
            try:
                self.idle.forget(lease)
                await self._aclose_budget(lease)
            finally:
                try:
                    await self.admission.arelease(lease)
                finally:
                    self._publish_released(lease, error)
            return
        try:
            try:
                await self.admission.arelease(lease)  # in process: no wait in it
            finally:
                self.idle.forget(lease)
        finally:
            try:
                await self._aclose_budget(lease)
            finally:
                self._publish_released(lease, error)

    async def _aclose_budget(self, lease: Lease) -> None:
        if self.budget_is_open(lease):  # closing it waits on the engine
            await _to_thread_to_the_end(self._close_budget, lease)
        else:
            self._close_budget(lease)

    def _mark_released(self, lease: Lease) -> bool:
        """True for the one caller that releases the lease (a lease is released once)."""
        with self._lock:
            if lease.released_at is not None:
                return False
            lease.released_at = self.clock.now()
            self._parents.pop(lease.lease_id, None)
            return True

    def _close_budget(self, lease: Lease) -> None:
        with self._lock:
            budget_open = lease.budget in self._budgets_open
            self._budgets_open.discard(lease.budget)
        if budget_open and not self.admission.expired(lease):  # else closed by its reaper
            with self.idle.backend_lock:  # never in the middle of an offload of it
                # Not waited for where the backend allows (governor.unwaited).
                close_budget_unwaited(self.backend, lease.budget, self.unwaited)

    def _publish_released(self, lease: Lease, error: BaseException | None) -> None:
        self.events.publish(
            "released",
            lease,
            tokens_in_context=lease.tokens_in_context,
            num_calls=lease.num_calls,
            error=error_name(error),
        )

    # -- waits: parked, resumed -------------------------------------------------------
    def park(self, lease: Lease, *, reason: str = "manual") -> None:
        """The lease waits on a tool or its children: it stops counting against limits."""
        if self.admission.park(lease):
            self.events.publish("parked", lease, reason=reason)

    def resume(self, lease: Lease) -> Lease:
        """Back to work: its idle period ends; a parked lease waits for admission again."""
        self.idle.end(lease)
        if lease.state is LeaseState.PARKED:
            return self.acquire(lease)
        return lease

    async def aresume(self, lease: Lease) -> Lease:
        self.idle.end(lease)
        if lease.state is LeaseState.PARKED:
            return await self.aacquire(lease)
        return lease

    def between_calls(self, lease: Lease) -> None:
        """Parked after ``park_after_s`` (reason ``"turn"``) unless a call, a tool or its
        release comes first; its KV is not held for it."""
        if lease.state is LeaseState.ACTIVE:
            self.idle.begin(lease, reason="turn", budget_open=False, hold_kv=False)

    def begin_tool(self, lease: Lease, *, expected_s: float | None) -> None:
        """A tool runs: the lease is idle, its KV held unless the tool is ``expected_s``
        to run past ``retain_s``."""
        budget_open = self.budget_is_open(lease)
        self.idle.begin(lease, reason="tool", budget_open=budget_open, expected_s=expected_s)

    def end_tool(self, lease: Lease) -> None:
        self.idle.end(lease)

    def tool_calls_backend(self, lease: Lease) -> bool:
        """Whether ``begin_tool`` calls the backend (to hold the lease's KV)."""
        return self.idle.needs_backend(lease, budget_open=self.budget_is_open(lease))

    # -- growth -----------------------------------------------------------------------
    def grow(self, lease: Lease, tokens: int) -> None:
        """Raise the lease's ceiling by ``tokens``: at once when admission has room for
        the larger reservation, else parked at the larger size and queued again (this
        thread waits); the engine budget is resized after either."""
        ceiling = self._larger_ceiling(lease, tokens)
        if not self.admission.try_grow(lease, ceiling):
            self._park_to_grow(lease, ceiling)
            self.acquire(lease)
        if self.budget_is_open(lease):
            self.backend.resize_budget(lease.budget, max_blocks=lease.blocks_reserved)

    async def agrow(self, lease: Lease, tokens: int) -> None:
        ceiling = self._larger_ceiling(lease, tokens)
        if not await self.admission.atry_grow(lease, ceiling):
            self._park_to_grow(lease, ceiling)
            await self.aacquire(lease)
        if self.budget_is_open(lease):
            await self.backend.aresize_budget(lease.budget, max_blocks=lease.blocks_reserved)

    @staticmethod
    def _larger_ceiling(lease: Lease, tokens: int) -> int:
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise ConfigError.below_minimum("tokens", tokens, 1)
        if lease.state is LeaseState.RELEASED:
            raise LeaseReleased(lease.lease_id, agent=lease.agent.name)
        return lease.ceiling_tokens + tokens

    def _park_to_grow(self, lease: Lease, ceiling: int) -> None:
        """Not grown at once: parked at the larger size in one step (under the admission
        lock), to queue for it."""
        if self.admission.park(lease, ceiling_tokens=ceiling):
            self.events.publish("parked", lease, reason="grow")

    # -- before a model call: the budget open, held KV back ----------------------------
    @property
    def holds_at_finish(self) -> bool:
        """Whether a call asks the backend to hold its context as it finishes."""
        return self.idle.holds_at_finish

    @property
    def open_budgets(self) -> frozenset[str]:
        """The engine budgets of leases opened and not yet closed."""
        with self._lock:
            return frozenset(self._budgets_open)

    def budget_is_open(self, lease: Lease) -> bool:
        with self._lock:
            return lease.budget in self._budgets_open

    def before_call(self, lease: Lease) -> None:
        """Open the lease's budget at its first call and bring its held KV back (it may
        wait on the engine: a worker thread's work on an event loop). ``LeaseExpired``
        when its room was given away (a shared store's lease whose process paused)."""
        self.admission.check_live(lease)
        if not self.budget_is_open(lease):
            self.admission.opening_budget(lease)
            self.backend.open_budget(lease.budget, max_blocks=lease.blocks_reserved)
            try:  # paused between the record and the open, past its TTL: closed again
                self.admission.check_live(lease)
            except LeaseExpired:
                with contextlib.suppress(BackendError):  # or its reaper closed it first
                    self.backend.close_budget(lease.budget)
                raise
            if not self._budget_opened(lease):
                self.backend.close_budget(lease.budget)
                raise LeaseReleased(lease.lease_id, agent=lease.agent.name)
        if self.idle.has_work_before_call(lease):
            self.idle.before_call(lease)

    async def abefore_call(self, lease: Lease) -> None:
        """``before_call`` for an event loop: the budget opens with ``aopen_budget``."""
        await self.admission.acheck_live(lease)
        if not self.budget_is_open(lease):
            # Shielded: a caller cancelled while the budget opens must still have it
            # marked open (and closed at release), or closed here when released meanwhile.
            opening = asyncio.ensure_future(self._aopen_budget(lease))
            opening.add_done_callback(_retrieved)
            await asyncio.shield(opening)
        if self.idle.has_work_before_call(lease):
            await asyncio.to_thread(self.idle.before_call, lease)

    async def _aopen_budget(self, lease: Lease) -> None:
        await self.admission.aopening_budget(lease)
        await self.backend.aopen_budget(lease.budget, max_blocks=lease.blocks_reserved)
        try:  # paused between the record and the open, past its TTL: closed again
            await self.admission.acheck_live(lease)
        except LeaseExpired:
            with contextlib.suppress(BackendError):  # or its reaper closed it first
                await self.backend.aclose_budget(lease.budget)
            raise
        if not self._budget_opened(lease):
            await self.backend.aclose_budget(lease.budget)
            raise LeaseReleased(lease.lease_id, agent=lease.agent.name)

    def raise_if_expired(self, lease: Lease, error: BaseException) -> None:
        """After a failed call: ``LeaseExpired`` (from ``error``) when the lease's room was
        given away meanwhile, so its budget went too (a process paused mid-call)."""
        try:
            self.admission.check_live(lease)
        except LeaseExpired as expired:
            raise expired from error
        except StoreUnavailable:  # cannot tell: the call's own error says what happened
            return

    async def araise_if_expired(self, lease: Lease, error: BaseException) -> None:
        try:
            await self.admission.acheck_live(lease)
        except LeaseExpired as expired:
            raise expired from error
        except StoreUnavailable:
            return

    def _budget_opened(self, lease: Lease) -> bool:
        """Mark the lease's new budget open; False when the lease was released meanwhile
        (by another thread or task, which found no budget to close: the caller closes it)."""
        with self._lock:
            if lease.released_at is not None:
                return False
            self._budgets_open.add(lease.budget)
            return True


async def _to_thread_to_the_end(fn: Callable[..., None], *args: object) -> None:
    """``fn(*args)`` on a worker thread, run to its end even when the awaiting task is
    cancelled: ``asyncio.to_thread`` would drop a call still queued for a thread."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    await asyncio.shield(asyncio.get_running_loop().run_in_executor(None, call))


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Its outcome is read: a shielded task whose awaiter was cancelled logs no warning."""
    if not task.cancelled():
        task.exception()
