"""``SharedAdmission``: guaranteed-mode admission on a store that many governors share.

The ledger (every lease's state and reservation, the queue in admission order, the
caps' counts, the limit) lives on the store and changes only in its script, atomically,
so governors in many processes admit against one budget with no lost update and no
double count. This object keeps the local side: the leases of this governor that the
store knows, their waiters, and which of them expired. A lease's local state follows the
store's: WAITING when queued, ACTIVE when the store admits it (this governor's own
operation, or another process's, heard on its process's ``admitted`` channel), PARKED and RELEASED
as its owner says.

A lease expires when its process stops heartbeating for the store's TTL: whichever
process runs the next operation reaps it, returns its blocks and is handed its engine
budget to close (``on_reaped``), exactly once. The expired lease's own process learns it
at its next heartbeat or call (``check_live`` sends a heartbeat first when the last one
is older than half the TTL, so a process back from a pause asks before it calls), and
raises ``LeaseExpired``; it never books the room twice.

``_lock`` is last in the governor's lock order (docs/design/lock-order.md), in the
admission controller's place: waiter wake-ups run under it, nothing else.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import threading
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Protocol

from governor.admission_base import AdmissionBase
from governor.admission_policy import AdmissionPolicy, PriorityWithAging
from governor.config import GovernorConfig
from governor.errors import AdmissionRejected, ConfigError, LeaseExpired, StoreUnavailable
from governor.lease import Lease, LeaseState
from governor.placement import Placement
from governor.sizing import blocks_per_seq
from governor.store._link import Reply, StoreLink
from governor.wakeup import Waiter

if TYPE_CHECKING:
    from governor.clock import Clock
    from governor.tool_durations import ToolDurations

__all__ = ["SharedAdmission", "SharedStore", "lease_process"]

_PROC_HEX = 12  # a process's id on the store: secrets.token_hex(6)


def lease_process(budget: str) -> str | None:
    """The store id of the process whose lease owns engine budget ``budget``
    (``lease-<process>.<n>``), or None for a budget of an in-process ledger or no lease."""
    lease_id = budget.removeprefix("lease-")
    proc, dot, number = lease_id.partition(".")
    hexdigits = "0123456789abcdef"
    if lease_id == budget or not dot or not number.isdigit() or len(proc) != _PROC_HEX:
        return None
    return proc if all(c in hexdigits for c in proc) else None


class SharedStore(Protocol):
    """What the ledger reads of its store (``RedisStore``)."""

    @property
    def where(self) -> str: ...

    @property
    def prefix(self) -> str: ...

    @property
    def lease_ttl_s(self) -> float: ...

    def client(self) -> Any: ...

    def connection_errors(self) -> tuple[type[BaseException], ...]: ...


class SharedAdmission(AdmissionBase):
    budget_before_room = True  # another process may be admitted into the room at once

    def __init__(
        self,
        store: SharedStore,
        *,
        config: GovernorConfig,
        available_blocks: int,
        block_size: int,
        policy: AdmissionPolicy | None,
        clock: Clock,
    ) -> None:
        super().__init__(config=config, available_blocks=available_blocks, block_size=block_size)
        self._policy = self._checked(policy)
        self._clock = clock
        self.store = store
        self.proc = secrets.token_hex(_PROC_HEX // 2)  # this governor's id on the store
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}  # the leases of this governor the store knows
        self._waiters: dict[str, Waiter] = {}  # by lease id, while queued
        self._expired: set[str] = set()
        self._previous: dict[str, LeaseState] = {}  # a lease's state before it queued
        self._holds: dict[str, int] = {}  # blocks each lease's retained KV holds
        self._budgets: set[str] = set()  # leases whose engine budget may be open
        self._closed = False
        self.link = StoreLink(
            store.client(),
            prefix=store.prefix,
            proc=self.proc,
            ttl_s=store.lease_ttl_s,
            where=store.where,
            connection_errors=store.connection_errors(),
            on_reply=self._on_reply,
            on_message=self._on_message,
            waiting_ids=self._waiting_ids,
            after_beat=self._ask_tools,
        )
        self._durations: ToolDurations | None = None
        self.link.start()
        try:
            cap = config.max_concurrent or 0
            per_agent, per_tenant = config.max_per_agent or 0, config.max_per_tenant or 0
            self.link.call("register", cap, per_agent, per_tenant)
            self.link.call("capacity", self.limit_blocks)
        except BaseException:
            self.link.close()
            raise

    def __repr__(self) -> str:
        return f"<SharedAdmission {self.proc} on {self.store.where}>"

    @staticmethod
    def _checked(policy: AdmissionPolicy | None) -> PriorityWithAging | None:
        if policy is None or isinstance(policy, PriorityWithAging):
            return policy
        raise ConfigError(
            f"a shared store orders the waiting leases of every process with "
            f"PriorityWithAging, on the store's clock; {type(policy).__name__} runs in one "
            "process only: leave policies.admission unset, or use PriorityWithAging(aging_s=...)",
            setting="admission",
        )

    # -- settings -----------------------------------------------------------------------
    @property
    def policy(self) -> AdmissionPolicy:
        return self._policy or PriorityWithAging(aging_s=self.config.aging_s)

    @policy.setter
    def policy(self, policy: AdmissionPolicy) -> None:
        self._policy = self._checked(policy)

    @property
    def placement(self) -> Placement | None:
        return None

    @placement.setter
    def placement(self, placement: Placement | None) -> None:
        if placement is not None:
            raise ConfigError(
                "a backend of several replicas (MultiBackend) places leases in one process's "
                "memory, which a shared store cannot see: give each replica its own Governor "
                "with the store, or run one process with the in-process store",
                setting="store",
            )

    def set_available_blocks(self, available_blocks: int) -> None:
        """The backend's capacity changed: the store's limit is the latest reading."""
        self.available_blocks = available_blocks
        self.link.post("capacity", self.limit_blocks, keep=True)

    def lease_id(self, number: int) -> str:
        return f"{self.proc}.{number}"

    # -- the queue ------------------------------------------------------------------------
    def enqueue(self, lease: Lease, waiter: Waiter) -> None:
        """Queue the lease on the store; its waiter wakes once the store admits it (maybe
        at once). ``StoreUnavailable`` when the store cannot be reached."""
        self._queued(lease, _result(self._queue(lease, waiter)))

    async def aenqueue(self, lease: Lease, waiter: Waiter) -> None:
        self._queued(lease, await _aresult(self._queue(lease, waiter)))

    def _queue(self, lease: Lease, waiter: Waiter) -> concurrent.futures.Future[Reply | None]:
        self.check_live(lease)
        lease_id = lease.lease_id
        with self._lock:  # before the post: an admission heard first finds the waiter
            previous = lease.state
            lease.queued_at = self._clock.now()
            lease.state = LeaseState.WAITING
            self._leases[lease_id] = lease
            self._waiters[lease_id] = waiter
            self._previous[lease_id] = previous
        return self._post_enqueue(lease)

    def _post_enqueue(self, lease: Lease) -> concurrent.futures.Future[Reply | None]:
        again = lease.admitted_at is not None
        aging_s = self.policy_aging_s()
        return self.link.post(
            "enqueue",
            lease.lease_id,
            lease.own_blocks_reserved,
            self._held_blocks(lease),
            lease.agent.name,
            lease.tenant or "",
            "" if lease.parent is None else lease.parent.lease_id,
            lease.priority,
            aging_s,
            "1" if again else "0",
        )

    def _queued(self, lease: Lease, outcome: Reply | BaseException) -> None:
        lease_id = lease.lease_id
        if isinstance(outcome, BaseException):
            with self._lock:  # not queued: as it was, and the store told to forget it
                self._waiters.pop(lease_id, None)
                lease.state = self._previous.pop(lease_id, lease.state)
                if lease.admitted_at is None:
                    self._leases.pop(lease_id, None)
            if lease.admitted_at is None:
                self.link.post("release", lease_id, keep=True)  # it may have arrived
            raise outcome
        with self._lock:
            self._previous.pop(lease_id, None)
        if outcome.status == "expired" and lease.admitted_at is None:
            return  # this process was reaped as it asked: queued again (_on_reply)
        if outcome.status in ("gone", "expired"):
            self._expire([lease_id])
            self.check_live(lease)
        if outcome.value == 1:
            self._admitted([lease_id])

    def cancel(self, lease: Lease) -> bool:
        """Take a waiting lease off the store's queue. False when it was admitted
        meanwhile (the caller then owns an active lease and must release it)."""
        return self._cancelled(lease, _result(self.link.post("cancel", lease.lease_id)))

    async def acancel(self, lease: Lease) -> bool:
        return self._cancelled(lease, await _aresult(self.link.post("cancel", lease.lease_id)))

    def _cancelled(self, lease: Lease, outcome: Reply | BaseException) -> bool:
        lease_id = lease.lease_id
        with self._lock:
            self._previous.pop(lease_id, None)
        if isinstance(outcome, BaseException):  # the store is down: not admitted here
            with self._lock:
                self._waiters.pop(lease_id, None)
                self._leases.pop(lease_id, None)
                lease.state = LeaseState.RELEASED
            self.link.post("release", lease_id, keep=True)
            return True
        if outcome.status == "ok" and outcome.value == 2:  # admitted meanwhile
            self._admitted([lease_id])
            return False
        with self._lock:
            self._waiters.pop(lease_id, None)
            again = lease.admitted_at is not None and outcome.status == "ok"
            lease.state = LeaseState.PARKED if again else LeaseState.RELEASED
            if not again:
                self._leases.pop(lease_id, None)
        if outcome.status != "ok":
            self._expire([lease_id])
        return True

    def release(self, lease: Lease) -> None:
        """Return the lease's room on the store; kept and sent once the store is back
        when it is down (the caller never waits for a store that is away)."""
        future = self._release(lease)
        if future is not None:
            _result(future)

    async def arelease(self, lease: Lease) -> None:
        future = self._release(lease)
        if future is not None:
            await _aresult(future)

    def _release(self, lease: Lease) -> concurrent.futures.Future[Reply | None] | None:
        lease_id = lease.lease_id
        with self._lock:
            known = self._leases.pop(lease_id, None) is not None
            waiter = self._waiters.pop(lease_id, None)
            self._holds.pop(lease_id, None)
            self._budgets.discard(lease_id)
            self._previous.pop(lease_id, None)
            lease.state = LeaseState.RELEASED
            if waiter is not None:
                waiter.wake()
            expired = lease_id in self._expired
            self._expired.discard(lease_id)  # told already: nothing asks after it again
        if not known or expired:
            return None
        return self.link.post("release", lease_id, keep=True)

    def park(self, lease: Lease, *, ceiling_tokens: int | None = None) -> bool:
        """Park an active lease (True), at a new ceiling when given; the store hears it
        in order, without this caller waiting (it may hold the idle keeper's lock)."""
        with self._lock:
            parked = lease.state is LeaseState.ACTIVE
            if parked:
                lease.state = LeaseState.PARKED
            if ceiling_tokens is not None and lease.lease_id not in self._waiters:
                lease.ceiling_tokens = ceiling_tokens
            known = lease.lease_id in self._leases
        if known and (parked or ceiling_tokens is not None):
            own = "" if ceiling_tokens is None else str(lease.own_blocks_reserved)
            self.link.post("park", lease.lease_id, own, keep=True)
        return parked

    def try_grow(self, lease: Lease, ceiling_tokens: int) -> bool:
        return self._grown(lease, ceiling_tokens, _result(self._grow(lease, ceiling_tokens)))

    async def atry_grow(self, lease: Lease, ceiling_tokens: int) -> bool:
        future = self._grow(lease, ceiling_tokens)
        return self._grown(lease, ceiling_tokens, await _aresult(future))

    def _grow(self, lease: Lease, ceiling_tokens: int) -> concurrent.futures.Future[Reply | None]:
        self.check_live(lease)
        own = blocks_per_seq(ceiling_tokens, self.block_size) - lease.prefix_blocks
        if own > self._most_blocks():
            raise AdmissionRejected(
                ceiling_tokens, self._most_tokens(lease), agent=lease.agent.name
            )
        return self.link.post("grow", lease.lease_id, max(1, own))

    def _grown(self, lease: Lease, ceiling_tokens: int, outcome: Reply | BaseException) -> bool:
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome.status != "ok":
            self._expire([lease.lease_id])
            self.check_live(lease)
        if outcome.value == 1:
            lease.ceiling_tokens = ceiling_tokens
            return True
        return False

    def set_held(self, lease: Lease, num_blocks: int) -> None:
        """The device blocks the lease's retained context holds now; the store counts
        them while the lease is not active."""
        if lease.lease_id in self._leases:
            blocks = 0 if lease.state is LeaseState.RELEASED else num_blocks
            blocks = max(0, blocks - lease.prefix_blocks)
            self._holds[lease.lease_id] = blocks
            self.link.post("held", lease.lease_id, blocks, keep=True)

    def _held_blocks(self, lease: Lease) -> int:
        return self._holds.get(lease.lease_id, 0)

    def room_made(self) -> None:
        """Room is made across processes by the holds' own deadlines (``retain_s``):
        a store asks no process to move another's holds."""

    # -- the tools' durations, of every process ---------------------------------------------
    def share_tool_durations(self, durations: ToolDurations) -> None:
        """Send each tool call this governor records to the store, and bring every
        process's history of each tool back after each heartbeat."""
        self._durations = durations
        window = durations.window

        def sent(tool: str, elapsed_s: float) -> None:
            self.link.post("tool", tool, elapsed_s, window, keep=True)

        durations.on_record = sent

    def _ask_tools(self) -> None:
        if self._durations is not None:
            self.link.post("tools")

    def _shared_tools(self, tools: list[Any]) -> None:
        durations = self._durations
        if durations is None:
            return
        for name, calls, mean, recent in tools:
            durations.share(str(name), int(calls), float(mean), [float(s) for s in recent])

    # -- what the store tells -------------------------------------------------------------
    def _on_reply(self, name: str, reply: Reply) -> None:
        if reply.admitted:
            self._admitted(reply.admitted)
        if reply.closing and self.on_reaped is not None:
            self.on_reaped([f"lease-{lease_id}" for lease_id in reply.closing])
        if reply.restarted:  # emptied: nobody was reaped, everybody registers again
            self._restore()
        elif reply.status == "expired":  # this process was reaped: its leases are gone
            with self._lock:
                lost = [i for i, lease in self._leases.items() if lease.admitted_at is not None]
                waiting = [lease for lease in self._leases.values() if lease.admitted_at is None]
            self._expire(lost)
            self.link.eval_inline("register", *self._caps())
            for lease in waiting:  # never admitted, so nothing to lose: queued again
                self._post_enqueue(lease)
        if name == "heartbeat" and reply.status == "ok" and reply.value:
            self._admitted(reply.value)  # admissions whose message was lost
        if name == "tools" and reply.status == "ok" and reply.value:
            self._shared_tools(reply.value)

    def _on_message(self, kind: str, data: str) -> None:
        if kind == "admitted":
            self._admitted(data.split())
        elif data == self.proc:  # this process was reaped: the ops thread finds out
            self.link.post("heartbeat")

    def _admitted(self, lease_ids: Collection[str]) -> None:
        now = self._clock.now()
        with self._lock:
            for lease_id in lease_ids:
                waiter = self._waiters.pop(lease_id, None)
                lease = self._leases.get(lease_id)
                if lease is None or (waiter is None and lease.state is not LeaseState.WAITING):
                    continue
                lease.state = LeaseState.ACTIVE
                if lease.admitted_at is None:
                    lease.admitted_at = now
                if waiter is not None:
                    waiter.wake()

    def _expire(self, lease_ids: Collection[str]) -> None:
        with self._lock:
            for lease_id in lease_ids:
                self._expired.add(lease_id)
                self._leases.pop(lease_id, None)
                waiter = self._waiters.pop(lease_id, None)
                if waiter is not None:
                    waiter.wake()

    def _restore(self) -> None:
        """The store restarted empty: register this process and its leases again, as
        they stand (an active lease counted whatever the limit; admission waits one TTL
        for every process to do the same)."""
        args: list[str | int | float] = []
        with self._lock:
            for lease_id, lease in self._leases.items():
                state = {LeaseState.ACTIVE: "a", LeaseState.WAITING: "w"}.get(lease.state, "p")
                # a waiting lease queues again from now (the restarted store's clock is
                # the machine's: close enough to order the few that wait)
                rank = time.time() / self.policy_aging_s() - lease.priority
                args += [
                    lease_id,
                    state,
                    lease.own_blocks_reserved,
                    self._holds.get(lease_id, 0),
                    lease.agent.name,
                    lease.tenant or "",
                    "" if lease.parent is None else lease.parent.lease_id,
                    rank,
                    "1" if lease_id in self._budgets else "0",
                ]
        self.link.eval_inline("register", *self._caps())
        self.link.eval_inline("capacity", self.limit_blocks)
        self.link.eval_inline("restore", *args)

    def policy_aging_s(self) -> float:
        policy = self.policy
        return policy.aging_s if isinstance(policy, PriorityWithAging) else self.config.aging_s

    def _caps(self) -> tuple[int, int, int]:
        config = self.config
        return (config.max_concurrent or 0, config.max_per_agent or 0, config.max_per_tenant or 0)

    def _waiting_ids(self) -> list[str]:
        with self._lock:
            return list(self._waiters)

    # -- leases that outlive their room ---------------------------------------------------
    def expired(self, lease: Lease) -> bool:
        return lease.lease_id in self._expired

    def check_live(self, lease: Lease) -> None:
        """``LeaseExpired`` when the lease's room was given away; asked of the store
        first when it last answered over half a TTL ago. A store that is down cannot
        say, and cannot have reaped anyone either (a store back from silence gives every
        process a TTL to beat): the lease goes on."""
        if self._stale():
            _result(self.link.post("heartbeat", *self._waiting_ids()))
        self.raise_if_expired(lease)

    async def acheck_live(self, lease: Lease) -> None:
        if self._stale():
            await _aresult(self.link.post("heartbeat", *self._waiting_ids()))
        self.raise_if_expired(lease)

    def _stale(self) -> bool:
        """The store last answered more than half a TTL ago: this process may have been
        paused past its TTL, and must ask before it uses a lease."""
        return time.monotonic() - self.link.last_ok > self.store.lease_ttl_s / 2

    def raise_if_expired(self, lease: Lease) -> None:
        if lease.lease_id in self._expired:
            raise LeaseExpired(lease.lease_id, agent=lease.agent.name, ttl_s=self.store.lease_ttl_s)

    def opening_budget(self, lease: Lease) -> None:
        """Record on the store that the lease's engine budget opens (its reaper closes
        it then); ``LeaseExpired`` when the store no longer has the lease. A store that
        is down keeps the record to send later, and the budget opens all the same."""
        self.check_live(lease)
        self._budgets.add(lease.lease_id)
        self._recorded(lease, _result(self.link.post("budget", lease.lease_id, keep=True)))

    async def aopening_budget(self, lease: Lease) -> None:
        await self.acheck_live(lease)
        self._budgets.add(lease.lease_id)
        outcome = await _aresult(self.link.post("budget", lease.lease_id, keep=True))
        self._recorded(lease, outcome)

    def _recorded(self, lease: Lease, outcome: Reply | BaseException) -> None:
        if isinstance(outcome, Reply) and outcome.status in ("gone", "expired"):
            self._expire([lease.lease_id])
            self.raise_if_expired(lease)

    def budget_closed(self, budget: str) -> None:
        self.link.post("closed", budget.removeprefix("lease-"), keep=True)

    # -- reading the store ------------------------------------------------------------------
    def counts(self) -> tuple[int, int, int]:
        """Active leases, waiting leases, peak active so far: of every process."""
        value = self.link.call("counts").value
        return int(value[0]), int(value[1]), int(value[2])

    def ledger(self) -> tuple[int, int, int, int]:
        """The reservations of the active leases and the blocks held by leases not
        active, each as kept and as summed over the leases now, of every process."""
        value = self.link.call("ledger").value
        return int(value[0]), int(value[1]), int(value[2]), int(value[3])

    def blocks_committed(self) -> int:
        value = self.link.call("counts").value
        return int(value[3]) + int(value[4])

    def close(self) -> None:
        """Leave the store and stop the link's threads. Leases of this governor still
        held are reaped by the next operation of any other process (their budgets closed
        by it), not after the TTL; a store that cannot be reached lets them expire."""
        if not self._closed:
            self._closed = True
            _result(self.link.post("leave"))
            self.link.close()


def _result(future: concurrent.futures.Future[Reply | None]) -> Reply | BaseException:
    try:
        reply = future.result()
    except StoreUnavailable as exc:
        return exc
    return reply if reply is not None else _KEPT


async def _aresult(future: concurrent.futures.Future[Reply | None]) -> Reply | BaseException:
    try:
        # shielded: a cancelled caller leaves the operation to run (the store hears it
        # in order, and the caller's cancel after it)
        reply = await asyncio.shield(asyncio.wrap_future(future))
    except StoreUnavailable as exc:
        return exc
    return reply if reply is not None else _KEPT


# A kept write's reply: the store was down and has it queued, nothing to read.
_KEPT = Reply("kept", "", False, (), (), 0)
