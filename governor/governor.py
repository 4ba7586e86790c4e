"""``Governor``: agents request context the way programs request memory; the front.

``governor.lease(agent, ...)`` waits for admission and yields an ACTIVE ``Lease`` (``with``
on threads, ``async with`` on event loops); model calls (``complete``, ``acomplete``,
``astream``) and tool calls (``tool_call``) run within it, and every decision is published
as a ``GovernorEvent`` (``subscribe``). ``Governor`` builds its collaborators and delegates:
``LeaseLifecycle`` (``governor.lifecycle``), ``ModelCalls`` (``governor.calls``) and
``ToolCalls`` (``governor.tool_calls``). Async paths never wait on the engine or the
network on the event loop; time comes from one clock, ``Governor(clock=...)``.

A lease's life: docs/design/lease-life.md.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from governor.agent import AgentSpec
from governor.backend import (
    Backend,
    GenerationChunk,
    GenerationResult,
    Message,
    PrefixHandle,
)
from governor.calls import ModelCalls
from governor.ceiling import CompactionEvent
from governor.children import ChildContext
from governor.clock import SYSTEM_CLOCK, Clock
from governor.config import GovernorConfig
from governor.errors import BackendError, ConfigError, LeaseReleased
from governor.events import EventBus, GovernorEvent, LeaseEvents, Subscriber
from governor.idle import IdleKeeper
from governor.lease import Lease, LeaseState
from governor.lease_context import LeaseContext
from governor.lifecycle import LeaseLifecycle
from governor.policy_set import Policies
from governor.prefixes import PrefixRegistry
from governor.pressure import PressureOrder
from governor.runs import Run
from governor.store import LocalStore, StateStore
from governor.tool_calls import ToolCall, ToolCalls
from governor.tool_durations import ToolDurations
from governor.tool_output import ToolOutputReduction
from governor.topology import TopologyReport, check_topology
from governor.truncate import HeadTailTruncation
from governor.unwaited import UnwaitedErrors

__all__ = ["Governor", "LeaseContext"]


class Governor:
    def __init__(
        self,
        backend: Backend,
        *,
        config: GovernorConfig | None = None,
        agents: Iterable[AgentSpec] = (),
        policies: Policies | None = None,
        clock: Clock = SYSTEM_CLOCK,
        store: StateStore | None = None,
    ) -> None:
        """``policies``: the tool-output, ceiling, admission and pressure decisions
        (``governor.Policies``); each left unset is the governor's default, given this
        governor's clock. ``clock``: where every time it reads and every deadline it arms
        come from (``governor.clock``); real time by default. ``store``: where the
        admission ledger lives; this process (``LocalStore``) by default, or a
        ``RedisStore`` that governors in other processes share, so they keep one budget
        (``close()`` the governor when done with it)."""
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
        if store is not None and not isinstance(store, StateStore):
            raise ConfigError(
                f"store must be a governor.store.LocalStore() or RedisStore(url), got "
                f"{type(store).__name__}",
                setting="store",
            )
        self.store = store or LocalStore()
        capacity = backend.capacity()
        self.admission = self.store.admission(
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
        lease_events = LeaseEvents(self.events, clock)
        self.unwaited = UnwaitedErrors()  # errors of writes nobody waited for
        self.tool_durations = ToolDurations()  # each tool's history, where expected_s is unset
        self.admission.share_tool_durations(self.tool_durations)  # with a shared store's
        self.idle = IdleKeeper(
            backend=backend,
            config=self.config,
            pressure=self.policies.pressure or PressureOrder(clock=clock),
            events=lease_events,
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
            try:
                self.admission.placement = placement(safety_factor=self.config.safety_factor)
            except BaseException:
                self.admission.close()
                raise
        self.prefixes = PrefixRegistry(backend)
        self._lifecycle = LeaseLifecycle(
            backend=backend,
            config=self.config,
            admission=self.admission,
            idle=self.idle,
            events=lease_events,
            unwaited=self.unwaited,
            clock=clock,
        )
        self.fanout_limiter = self._lifecycle.fanout
        self.reaped_budgets = self._lifecycle.reaped  # others' budgets this one closes
        self._model_calls = ModelCalls(
            lifecycle=self._lifecycle,
            backend=backend,
            prefixes=self.prefixes,
            ceiling=self.policies.ceiling,
            counter=self.counter,
            config=self.config,
            events=lease_events,
            clock=clock,
        )
        self._tool_calls = ToolCalls(
            lifecycle=self._lifecycle,
            durations=self.tool_durations,
            output_policy=self.tool_output_policy,
            counter=self.counter,
            events=lease_events,
            clock=clock,
        )
        # A backend that can restart (RemoteBackend), or lose a replica (MultiBackend),
        # sets its budgets and pins up again itself; the held KV it lost is the
        # governor's to forget, and its capacity may have changed.
        on_lost = getattr(backend, "on_lost", None)  # only some budgets' KV (a replica's)
        on_restart = getattr(backend, "on_restart", None)
        if callable(on_lost):
            on_lost(self._backend_lost)
        elif callable(on_restart):
            on_restart(self._backend_restarted)

    def close(self) -> None:
        """Stop what the governor's store runs beside it (a ``RedisStore``'s heartbeat
        and subscriber) and leave the store: leases still held are then reaped by another
        process's next operation. Nothing to do for the in-process store."""
        self.admission.close()

    def __enter__(self) -> Governor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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
        lease = self._new_lease(agent, ceiling_tokens, priority, parent=None, tenant=tenant)
        return LeaseContext(self._lifecycle, lease)

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
        return self._lifecycle.request(
            spec,
            ceiling_tokens=spec.ceiling_tokens if ceiling_tokens is None else ceiling_tokens,
            priority=spec.priority if priority is None else priority,
            parent=parent,
            tenant=tenant,
            prefix_blocks=self.prefixes.pinned_blocks(spec.prefix, tenant=tenant),
            owner=self,
        )

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
        slot = self._lifecycle.child_slot(parent, lease)
        return ChildContext(parent, slot, LeaseContext(self._lifecycle, lease))

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
            planner_ceiling=p.ceiling_tokens,
            worker_ceiling=w.ceiling_tokens,
            num_workers=num_workers,
            max_fanout=p.max_fanout,
            planners=planners,
            available_blocks=self.admission.available_blocks,
            block_size=self.admission.block_size,
            safety_factor=self.config.safety_factor,
            expected_use=self.config.expected_use,
            planner_prefix_blocks=pinned(p.prefix, tenant=tenant),
            worker_prefix_blocks=pinned(w.prefix, tenant=tenant),
        )

    # -- a lease's life: LeaseLifecycle ------------------------------------------------
    def acquire(self, lease: Lease) -> Lease:
        """Wait (blocking this thread) until the lease is ACTIVE."""
        return self._lifecycle.acquire(lease)

    async def aacquire(self, lease: Lease) -> Lease:
        return await self._lifecycle.aacquire(lease)

    def release(self, lease: Lease, *, error: BaseException | None = None) -> None:
        """Return the lease's context, its held KV and its engine budget, exactly once
        whatever its state (a second call does nothing). ``error``: what ended the
        lease's work, when it failed (the ``released`` event's ``error``, so tracing
        marks the agent's span failed). Blocks on the engine: ``arelease`` on a loop."""
        self._lifecycle.release(lease, error=error)

    async def arelease(self, lease: Lease, *, error: BaseException | None = None) -> None:
        """``release`` for an event loop: the budget closes on a worker thread, and is
        closed even when this task is cancelled meanwhile."""
        await self._lifecycle.arelease(lease, error=error)

    def between_calls(self, lease: Lease) -> None:
        """The lease's agent is between model calls, with no tool running: reading its
        reply, or gone (a caller that stopped reading a stream abandons the run where
        it stands). It is parked after ``park_after_s`` (reason ``"turn"``) unless a
        call, a tool or its release comes first, so an abandoned run holds no admission
        room while it waits for the garbage collector. Its KV is not held for it."""
        self._lifecycle.between_calls(lease)

    def park(self, lease: Lease, *, reason: str = "manual") -> None:
        """The lease waits on a tool or its children: it stops counting against limits."""
        self._lifecycle.park(lease, reason=reason)

    def resume(self, lease: Lease) -> Lease:
        """Back to work: its idle period ends; a parked lease waits for admission again."""
        return self._lifecycle.resume(lease)

    async def aresume(self, lease: Lease) -> Lease:
        return await self._lifecycle.aresume(lease)

    def grow(self, lease: Lease, tokens: int) -> None:
        """Raise the lease's ceiling by ``tokens`` (``Lease.grow``): at once when admission
        has room for the larger reservation, else parked at the larger size and queued
        again; blocks this thread while it waits. ``agrow`` on an event loop. The engine
        budget the lease owns is resized after either."""
        self._lifecycle.grow(lease, tokens)

    async def agrow(self, lease: Lease, tokens: int) -> None:
        await self._lifecycle.agrow(lease, tokens)

    @property
    def _budgets_open(self) -> frozenset[str]:
        """The engine budgets of leases not yet released (tests read it)."""
        return self._lifecycle.open_budgets

    # -- model calls: ModelCalls -----------------------------------------------------
    def complete(
        self, lease: Lease, messages: Sequence[Message], **options: Any
    ) -> GenerationResult:
        """One model call within the lease (resumed first if it was parked; compacted by
        the ceiling policy when it would not fit; its held KV restored)."""
        return self._model_calls.complete(lease, messages, **options)

    async def acomplete(
        self, lease: Lease, messages: Sequence[Message], **options: Any
    ) -> GenerationResult:
        return await self._model_calls.acomplete(lease, messages, **options)

    def astream(
        self, lease: Lease, messages: Sequence[Message], **options: Any
    ) -> AsyncGenerator[GenerationChunk, None]:
        """A streamed model call within the lease; usage is recorded from the last chunk."""
        return self._model_calls.astream(lease, messages, **options)

    def with_prefix(
        self, lease: Lease, messages: Sequence[Message]
    ) -> tuple[Sequence[Message], str | None]:
        """The messages a call of this lease sends (the agent's registered prefix first,
        unless they start with it already) and the cache salt it is sent with."""
        return self._model_calls.with_prefix(lease, messages)

    def record_call(
        self,
        lease: Lease,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        finish_reason: str = "stop",
        elapsed_s: float = 0.0,
    ) -> None:
        """Record a model call the lease's agent made without the governor (a LangChain
        chat model of its own): its context and usage, and a ``call.finished`` event."""
        self._model_calls.record_call(
            lease,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            finish_reason=finish_reason,
            elapsed_s=elapsed_s,
        )

    def compact(
        self, lease: Lease, messages: Sequence[Message], *, max_tokens: int | None = None
    ) -> tuple[list[dict[str, Any]], CompactionEvent]:
        """The conversation the lease's next call sends (its shared prefix first),
        compacted by the ceiling policy when it and the reply's reserve (``max_tokens``,
        else ``reply_reserve_tokens`` up to a quarter of the ceiling) would not fit. Keep
        the result as the history, so later turns stay compacted."""
        return self._model_calls.compact(lease, messages, max_tokens=max_tokens)

    def reply_reserve(self, lease: Lease, max_tokens: int | None = None) -> int:
        """Tokens kept free for the reply when checking the ceiling: ``max_tokens``
        when the call names it, else ``reply_reserve_tokens`` up to a quarter of the
        ceiling."""
        return self._model_calls.reply_reserve(lease, max_tokens)

    # -- tool calls: ToolCalls -------------------------------------------------------
    def tool_call(
        self,
        lease: Lease,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        expected_s: float | None = None,
        question: str | None = None,
    ) -> ToolCall:
        """``with`` / ``async with`` around running a tool: the lease is idle meanwhile
        (parked after ``park_after_s``, its KV held up to ``retain_s`` unless the tool is
        ``expected_s`` to take longer, or, without ``expected_s``, its calls so far mostly
        took longer). ``call.reduce(output)`` fits its result to the agent's
        ``tool_output_tokens``, keeping what ``arguments`` and ``question`` (the agent's
        last request) ask for."""
        return self._tool_calls.tool_call(
            lease, tool, arguments, expected_s=expected_s, question=question
        )

    def reduce_tool_output(
        self,
        lease: Lease,
        text: str,
        *,
        tool: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        question: str | None = None,
    ) -> ToolOutputReduction:
        """Fit a tool's result to the agent's ``tool_output_tokens`` with the tool-output
        policy (unchanged, method ``"none"``, when the agent sets no such budget);
        ``question`` is the agent's last request, for a policy that reads it."""
        return self._tool_calls.reduce_tool_output(
            lease, text, tool=tool, arguments=arguments, question=question
        )


def _agent_name(agent: str | AgentSpec) -> str:
    return agent.name if isinstance(agent, AgentSpec) else str(agent)
