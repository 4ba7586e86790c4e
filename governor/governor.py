"""The governor: agents request context the way programs request memory.

``governor.lease(agent, ...)`` waits for admission and yields an ACTIVE ``Lease``; the
same call works as ``with`` (threads) and ``async with`` (event loops). Model calls go
through ``complete`` / ``acomplete`` / ``astream`` within the lease: tokens counted
exactly with the backend's tokenizer, the conversation compacted by the ceiling policy
when the next call would exceed the ceiling, which the engine budget the lease owns
enforces too (opened at its first call, closed at release). ``tool_call`` marks the
lease idle while a tool runs: parked, its KV held, offloaded under pressure, restored
before its next call (``governor.idle``); a tool's result is reduced to the agent's
``tool_output_tokens`` by the tool-output policy. Every decision is published as a
``GovernorEvent`` (``subscribe``). A cancelled or timed-out waiter leaves no trace; a
released lease returns its budget and its held KV, exactly once, whatever state it is in
(active, parked, or queued again when its owner gave up).

Async paths never wait on the engine or the network on the event loop: opening and
resizing a budget use the backend's async calls (``aopen_budget``, ``aresize_budget``);
what runs under the idle keeper's lock (closing a budget, holding, offloading and
restoring KV) and tokenizing run on a worker thread (``asyncio.to_thread``) or on the
deadline thread.

Time comes from one clock, ``Governor(clock=...)`` (``governor.clock``): lease times,
queue ages, order times, elapsed times, event timestamps and the deadlines of idle
leases. The default, ``SYSTEM_CLOCK``, is real time; the hardware twin passes a virtual
one, and drives the governor through its async API (``governor.clock`` says why). "The
deadline thread" here is wherever the clock runs its callbacks (``SystemClock``: one
daemon thread).

Threads and event loops share a governor. Its locks, in the only order they are taken
(a lock is never taken while one after it is held):

1. ``IdleKeeper._backend`` (re-entrant): the keeper's backend calls (hold, offload,
   restore, drop) and each lease's ``close_budget``. Held across engine steps, so only
   threads take it: never an event loop, never a fan-out hook.
2. ``FanoutLimiter._lock``: a child's slot. Its hook parks the parent (3, 4) and leaves
   the hold of the parent's KV to the deadline thread; it never waits.
3. ``IdleKeeper._lock``: idle periods and holds. Never held across a backend call.
   Parking by deadline checks and parks under it.
4. ``Governor._lock``: the open budgets, parents and released marks. Nothing is called
   under it.
5. ``AdmissionController._lock``: the queue and the ledger of reservations and holds;
   an active lease's ceiling changes only under it. The admission policy and waiter
   wake-ups run under it and never call back.

Backend locks (``LocalBackend``'s, ``FakeBackend``'s, the engine loop's), the deadline
thread's, the event bus's and ``ToolDurations``' come after all of these and call nothing
back (arming a deadline under 5 is allowed); subscribers run under none of 3-5.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import math
import threading
from collections.abc import Callable, Collection, Iterable, Sequence

from governor.admission import AdmissionController, Waiter
from governor.agent import AgentSpec
from governor.backend import Backend, Message, PrefixHandle
from governor.calls import ModelCalls
from governor.children import ChildContext
from governor.clock import SYSTEM_CLOCK, Clock
from governor.config import GovernorConfig
from governor.errors import AdmissionTimeout, BackendError, ConfigError, LeaseReleased
from governor.events import EventBus, GovernorEvent, Subscriber, error_name
from governor.fanout import FanoutLimiter
from governor.growth import Growth
from governor.idle import IdleKeeper
from governor.lease import Lease, LeaseState
from governor.lease_context import LeaseContext
from governor.policy_set import Policies
from governor.prefixes import PrefixRegistry
from governor.pressure import PressureOrder
from governor.runs import Run, current_run_id
from governor.tool_calls import ToolCalls, ToolDurations
from governor.topology import TopologyReport, check_topology
from governor.truncate import HeadTailTruncation
from governor.unwaited import UnwaitedErrors, close_budget_unwaited

__all__ = ["Governor", "LeaseContext"]


class Governor(ModelCalls, ToolCalls, Growth):
    def __init__(
        self,
        backend: Backend,
        *,
        config: GovernorConfig | None = None,
        agents: Iterable[AgentSpec] = (),
        policies: Policies | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``policies``: the tool-output, ceiling, admission and pressure decisions
        (``governor.Policies``); each left unset is the governor's default, given this
        governor's clock. ``clock``: where every time it reads and every deadline it arms
        come from (``governor.clock``); real time by default."""
        if policies is not None and not isinstance(policies, Policies):
            raise ConfigError(
                f"policies must be a governor.Policies(tool_output=..., ceiling=..., "
                f"admission=..., pressure=...), got {type(policies).__name__}",
                setting="policies",
            )
        if not isinstance(clock, Clock):
            raise ConfigError(
                f"clock must have now(), wall() and call_later(seconds, fn, *args) "
                f"(governor.Clock), got {type(clock).__name__}; leave it out for real time "
                "(governor.SYSTEM_CLOCK)",
                setting="clock",
            )
        self.clock = clock
        self.backend = backend
        self.config = config or GovernorConfig()
        self.policies = policies or Policies()
        self.counter = backend.counter
        self.agents: dict[str, AgentSpec] = {}
        for spec in agents:
            self.register_agent(spec)
        capacity = backend.capacity()
        self.admission = AdmissionController(
            config=self.config,
            available_blocks=capacity.num_available_blocks,
            block_size=capacity.block_size,
            policy=self.policies.admission,
            clock=clock,
        )
        self.tool_output_policy = self.policies.tool_output or HeadTailTruncation(
            self.counter, clock=clock
        )
        self.events = EventBus()
        self.unwaited = UnwaitedErrors()  # errors of writes nobody waited for
        self.tool_durations = ToolDurations()  # each tool's history, where expected_s is unset
        self.idle = IdleKeeper(
            backend=backend,
            config=self.config,
            pressure=self.policies.pressure or PressureOrder(clock=clock),
            events=self.events,
            park=self.admission.park,
            held=self.admission.set_held,
            room_made=self.admission.room_made,
            unwaited=self.unwaited,
            clock=clock,
        )
        self.admission.make_room = self.idle.make_room
        # A backend of several replicas says where a lease fits (governor.placement).
        placement = getattr(backend, "placement", None)
        if callable(placement):
            self.admission.placement = placement(safety_factor=self.config.safety_factor)
        self._ids = itertools.count()
        self._lock = threading.Lock()  # the two below and release marks (lock order: top)
        self._budgets_open: set[str] = set()
        self._parents: dict[str, Lease] = {}  # lease id -> lease, while it has children
        self.prefixes = PrefixRegistry(backend)
        self.fanout_limiter = FanoutLimiter(on_first_child=self._park_parent)
        # A backend that can restart (RemoteBackend), or lose a replica (MultiBackend),
        # sets its budgets and pins up again itself; the held KV it lost is the
        # governor's to forget, and its capacity may have changed.
        on_lost = getattr(backend, "on_lost", None)  # only some budgets' KV (a replica's)
        on_restart = getattr(backend, "on_restart", None)
        if callable(on_lost):
            on_lost(self._backend_lost)
        elif callable(on_restart):
            on_restart(self._backend_restarted)

    def run(self, name: str = "run") -> Run:
        """``with`` / ``async with``: one workflow invocation; the leases requested inside
        it (and in the threads and tasks it starts) carry its id."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a run needs a non-empty name, got {name!r}", setting="name")
        return Run(name, self._publish_run, clock=self.clock)

    def _publish_run(self, kind: str, run: Run, **attributes: object) -> None:
        if self.events.active:
            self.events.publish(
                GovernorEvent(kind, run_id=run.run_id, attributes=attributes, at=self.clock.wall())
            )

    def _backend_restarted(self) -> None:
        self.idle.lost("the backend restarted; its KV is gone")
        self._read_capacity()

    def _backend_lost(self, budgets: Collection[str]) -> None:
        if budgets:
            self.idle.lost("a replica of the backend went away; its KV is gone", budgets=budgets)
        self._read_capacity()

    def _read_capacity(self) -> None:
        try:
            available = self.backend.capacity().num_available_blocks
        except BackendError:  # away again: the figure it had stands until the next hook
            return
        self.admission.set_available_blocks(available)

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Call ``subscriber(event)`` for every ``GovernorEvent``; returns the function
        that unsubscribes it."""
        return self.events.subscribe(subscriber)

    def register_agent(self, spec: AgentSpec) -> None:
        self.agents[spec.name] = spec

    def register_prefix(
        self,
        name: str,
        prefix: str | Sequence[Message],
        *,
        tenant: str | None = None,
        shared: bool = False,
    ) -> PrefixHandle:
        """Pin a system prompt or tool schema once; every lease of an agent whose
        ``AgentSpec.prefix`` is ``name`` starts with it and reuses its blocks, which are
        counted once: admission sizes from the blocks left after pins, and charges a
        lease made after this only its own blocks beyond them (``Lease.prefix_blocks``).
        Per tenant unless ``shared`` (see ``governor.prefixes`` for what sharing costs)."""
        handle = self.prefixes.register(name, prefix, tenant=tenant, shared=shared)
        self.admission.set_available_blocks(self.backend.capacity().num_available_blocks)
        return handle

    def unregister_prefix(
        self, name: str, *, tenant: str | None = None, shared: bool = False
    ) -> None:
        self.prefixes.unregister(name, tenant=tenant, shared=shared)
        self.admission.set_available_blocks(self.backend.capacity().num_available_blocks)

    def agent(self, name: str) -> AgentSpec:
        try:
            return self.agents[name]
        except KeyError:
            raise ConfigError.unknown_agent(name, self.agents) from None

    # -- leases ---------------------------------------------------------------------
    def lease(
        self,
        agent: str | AgentSpec,
        *,
        ceiling_tokens: int | None = None,
        priority: int | None = None,
        parent: Lease | None = None,
        tenant: str | None = None,
    ) -> LeaseContext:
        """``with`` or ``async with``: an ACTIVE lease for the block, released after it.

        Refused at once with ``AdmissionRejected`` when its ceiling can never fit. A
        sub-agent's lease comes from ``child()`` or ``fanout()``, which take one of the
        parent's fan-out slots; ``parent=`` here is refused with a ``ConfigError``, since
        a lease that named a parent without a slot would slip past ``max_fanout``.
        """
        if parent is not None:
            raise ConfigError(
                f"lease(parent=...) takes no fan-out slot, so it would run past the parent "
                f"agent's max_fanout; use governor.child(parent, {_agent_name(agent)!r}) "
                "for one sub-agent or governor.fanout(parent, agent, n) for several",
                setting="parent",
            )
        return LeaseContext(
            self, self._new_lease(agent, ceiling_tokens, priority, parent=None, tenant=tenant)
        )

    def _new_lease(
        self,
        agent: str | AgentSpec,
        ceiling_tokens: int | None,
        priority: int | None,
        *,
        parent: Lease | None,
        tenant: str | None,
    ) -> Lease:
        spec = agent if isinstance(agent, AgentSpec) else self.agent(agent)
        ceiling = spec.ceiling_tokens if ceiling_tokens is None else ceiling_tokens
        if not isinstance(ceiling, int) or isinstance(ceiling, bool) or ceiling < 1:
            raise ConfigError.below_minimum("ceiling_tokens", ceiling, 1)
        number = next(self._ids)
        lease = Lease(
            lease_id=str(number),
            agent=spec,
            ceiling_tokens=ceiling,
            priority=spec.priority if priority is None else priority,
            block_size=self.admission.block_size,
            arrival=number,
            requested_at=self.clock.now(),
            tenant=tenant,
            parent=parent,
            run_id=current_run_id(),
            governor=self,
            expected_tokens=math.ceil(ceiling * self.config.expected_use),
            prefix_blocks=self.prefixes.pinned_blocks(spec.prefix, tenant=tenant),
        )
        self.admission.check_can_ever_fit(lease)
        self._publish(
            "requested",
            lease,
            ceiling_tokens=ceiling,
            priority=lease.priority,
            parent_id=None if parent is None else parent.lease_id,
            prefix_blocks=lease.prefix_blocks,
        )
        return lease

    def child(
        self,
        parent: Lease,
        agent: str | AgentSpec,
        *,
        ceiling_tokens: int | None = None,
        priority: int | None = None,
    ) -> ChildContext:
        """A sub-agent's lease under ``parent``'s fan-out cap (``with``/``async with``);
        the parent is parked while its children run."""
        if parent.state is LeaseState.RELEASED:
            raise LeaseReleased(parent.lease_id, agent=parent.agent.name)
        lease = self._new_lease(
            agent,
            ceiling_tokens,
            parent.priority if priority is None else priority,
            parent=parent,
            tenant=parent.tenant,
        )
        with self._lock:
            self._parents[parent.lease_id] = parent
        slot = self.fanout_limiter.slot(
            parent.lease_id, parent.agent.max_fanout, timeout_s=self.config.admission_timeout_s
        )
        return ChildContext(parent, slot, LeaseContext(self, lease))

    def fanout(
        self, parent: Lease, agent: str | AgentSpec, n: int, **options: int | None
    ) -> list[ChildContext]:
        """``n`` child contexts for a fan-out; at most ``max_fanout`` run at once."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ConfigError.below_minimum("n", n, 0)
        return [self.child(parent, agent, **options) for _ in range(n)]

    def check_topology(
        self,
        *,
        planner: str | AgentSpec,
        worker: str | AgentSpec,
        num_workers: int,
        planners: int = 1,
        tenant: str | None = None,
    ) -> TopologyReport:
        """Before a run: whether planner(s) fanning out to ``num_workers`` workers fit
        this backend in each admission mode, and if not, why and what would; at this
        governor's settings, the agents' shared prefixes (``tenant``'s, else the shared
        ones) counted once, as admission counts them."""
        p = planner if isinstance(planner, AgentSpec) else self.agent(planner)
        w = worker if isinstance(worker, AgentSpec) else self.agent(worker)
        pinned = self.prefixes.pinned_blocks
        return check_topology(
            planner_ceiling=p.ceiling_tokens, worker_ceiling=w.ceiling_tokens,
            num_workers=num_workers, max_fanout=p.max_fanout, planners=planners,
            available_blocks=self.admission.available_blocks,
            block_size=self.admission.block_size,
            safety_factor=self.config.safety_factor, expected_use=self.config.expected_use,
            planner_prefix_blocks=pinned(p.prefix, tenant=tenant),
            worker_prefix_blocks=pinned(w.prefix, tenant=tenant),
        )  # fmt: skip

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

    def acquire(self, lease: Lease) -> Lease:
        """Wait (blocking this thread) until the lease is ACTIVE."""
        waiter = Waiter()
        started, resumed = self.clock.now(), lease.state is LeaseState.PARKED
        self.admission.enqueue(lease, waiter)
        if not waiter.wait(self.config.admission_timeout_s) and self.admission.cancel(lease):
            raise AdmissionTimeout(lease.agent.name, self.config.admission_timeout_s)
        self._admitted(lease, started, resumed)
        return lease

    async def aacquire(self, lease: Lease) -> Lease:
        waiter = Waiter(loop=asyncio.get_running_loop())
        started, resumed = self.clock.now(), lease.state is LeaseState.PARKED
        self.admission.enqueue(lease, waiter)
        try:
            admitted = await waiter.await_(self.config.admission_timeout_s)
        except asyncio.CancelledError:
            if not self.admission.cancel(lease):  # admitted as we were cancelled:
                self._publish_admitted(lease, started, resumed)  # its span says both
                await self.arelease(lease, error=asyncio.CancelledError())
            raise
        if not admitted and self.admission.cancel(lease):
            raise AdmissionTimeout(lease.agent.name, self.config.admission_timeout_s)
        self._admitted(lease, started, resumed)
        return lease

    def _admitted(self, lease: Lease, started: float, resumed: bool) -> None:
        if lease.state is LeaseState.RELEASED:  # released by another thread as it waited
            raise LeaseReleased(lease.lease_id, agent=lease.agent.name)
        self._publish_admitted(lease, started, resumed)

    def _publish_admitted(self, lease: Lease, started: float, resumed: bool) -> None:
        if self.events.active:
            wait_s = self.clock.now() - started
            kind = "resumed" if resumed else "admitted"
            self._publish(kind, lease, wait_s=wait_s, ceiling_tokens=lease.ceiling_tokens)

    def release(self, lease: Lease, *, error: BaseException | None = None) -> None:
        """Return the lease's context, its held KV and its engine budget, exactly once
        whatever its state (a second call does nothing). ``error``: what ended the
        lease's work, when it failed (the ``released`` event's ``error``, so tracing
        marks the agent's span failed). Blocks on the engine: ``arelease`` on a loop."""
        if not self._mark_released(lease):
            return
        try:
            self._release_admission(lease)
        finally:
            self._release_budget(lease, error)

    async def arelease(self, lease: Lease, *, error: BaseException | None = None) -> None:
        """``release`` for an event loop: the budget closes on a worker thread, and is
        closed even when this task is cancelled meanwhile."""
        if not self._mark_released(lease):
            return
        try:
            self._release_admission(lease)
        finally:
            if self._budget_open(lease):  # closing it waits on the engine
                await _to_thread_to_the_end(self._release_budget, lease, error)
            else:
                self._release_budget(lease, error)

    def _mark_released(self, lease: Lease) -> bool:
        """True for the one caller that releases the lease (a lease is released once)."""
        with self._lock:
            if lease.released_at is not None:
                return False
            lease.released_at = self.clock.now()
            self._parents.pop(lease.lease_id, None)
            return True

    def _release_admission(self, lease: Lease) -> None:
        try:
            self.admission.release(lease)  # a failing admission policy raises here...
        finally:  # ...and the lease's hold is forgotten all the same
            self.idle.forget(lease)

    def _release_budget(self, lease: Lease, error: BaseException | None) -> None:
        with self._lock:
            budget_open = lease.budget in self._budgets_open
            self._budgets_open.discard(lease.budget)
        try:
            if budget_open:
                with self.idle.backend_lock:  # never in the middle of an offload of it
                    # Not waited for where the backend allows (governor.unwaited).
                    close_budget_unwaited(self.backend, lease.budget, self.unwaited)
        finally:  # the lease has ended, even where the engine failed to close its budget
            self._publish(
                "released",
                lease,
                tokens_in_context=lease.tokens_in_context,
                num_calls=lease.num_calls,
                error=error_name(error),
            )

    def between_calls(self, lease: Lease) -> None:
        """The lease's agent is between model calls, with no tool running: reading its
        reply, or gone (a caller that stopped reading a stream abandons the run where
        it stands). It is parked after ``park_after_s`` (reason ``"turn"``) unless a
        call, a tool or its release comes first, so an abandoned run holds no admission
        room while it waits for the garbage collector. Its KV is not held for it."""
        if lease.state is LeaseState.ACTIVE:
            self.idle.begin(lease, reason="turn", budget_open=False, hold_kv=False)

    def park(self, lease: Lease, *, reason: str = "manual") -> None:
        """The lease waits on a tool or its children: it stops counting against limits."""
        if self.admission.park(lease):
            self._publish("parked", lease, reason=reason)

    def _budget_open(self, lease: Lease) -> bool:
        with self._lock:
            return lease.budget in self._budgets_open

    def _publish(
        self, kind: str, lease: Lease, *, record: object = None, **attributes: object
    ) -> None:
        if self.events.active:
            self.events.publish(
                GovernorEvent(
                    kind,
                    lease_id=lease.lease_id,
                    agent=lease.agent.name,
                    tenant=lease.tenant,
                    run_id=lease.run_id,
                    attributes=attributes,
                    record=record,
                    at=self.clock.wall(),
                )
            )

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


async def _to_thread_to_the_end(fn: Callable[..., None], *args: object) -> None:
    """``fn(*args)`` on a worker thread, run to its end even when the awaiting task is
    cancelled: ``asyncio.to_thread`` would drop a call still queued for a thread."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    await asyncio.shield(asyncio.get_running_loop().run_in_executor(None, call))


def _agent_name(agent: str | AgentSpec) -> str:
    return agent.name if isinstance(agent, AgentSpec) else str(agent)
