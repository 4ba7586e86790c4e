"""``Ledger``: ``MultiBackend``'s bookkeeping of replicas and budgets, all in memory.

Per replica: in rotation or not (and when to probe it next), calls in flight, its
limit in blocks (``floor(available x safety_factor)``, from its last capacity read).
Per budget: its size, the replica it is placed on (the governor's reservation,
``governor.placement``, charged there while its lease is active; remembered after, so
the lease comes back to it) and the replica it is open on (where its calls go).

Every method decides under one leaf lock and returns what to do; ``MultiBackend`` does
the I/O after, outside it. The lock is never held across a call to a replica or a hook
(only the KV-event index's lock, a leaf, is taken under it, and ``sent_salt``, which
computes a replica's salt without I/O, is called), and the governor's
admission lock may be held while ``max_blocks``, ``can_place``, ``place`` and
``unplace`` take it.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from backends.multi._routing import PrefixIndex, Routing
from backends.multi.kv_events import KVEventIndex
from governor import BackendCapacity

__all__ = ["Ledger", "Move"]


@dataclass(slots=True)
class _Replica:
    up: bool = True
    next_probe: float = 0.0
    in_flight: int = 0
    limit: int = 0  # blocks leases may reserve here
    capacity: BackendCapacity | None = None


@dataclass(slots=True)
class _Budget:
    max_blocks: int
    replica: int | None = None  # placed here (affinity), or None before its first call
    reserved: int = 0  # blocks the governor reserved on ``replica`` (0 while not active)
    placed: bool = False  # the governor places it (guaranteed mode)
    opened: bool = False  # open_budget was called: close_budget will be
    opened_on: int | None = None  # the replica that has it open


@dataclass(frozen=True, slots=True)
class Move:
    """What a call of a budget needs first: close it on ``close_on``, open it on ``open_on``."""

    replica: int
    open_on: int | None = None
    close_on: int | None = None
    max_blocks: int = 0


@dataclass(slots=True, repr=False)
class Ledger:
    routing: Routing
    num_replicas: int
    safety_factor: float = 1.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    replicas: list[_Replica] = field(init=False)
    budgets: dict[str, _Budget] = field(default_factory=dict)
    index: PrefixIndex = field(init=False)
    kv_events: KVEventIndex | None = None  # the engines' own record, where they publish one
    # the cache salt replica i's engine is sent for a call's (its KV events carry that one)
    sent_salt: Callable[[int, str | None], str | None] | None = None
    _turn: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.replicas = [_Replica() for _ in range(self.num_replicas)]
        self.index = PrefixIndex(self.num_replicas, chunk_chars=self.routing.chunk_chars)

    # -- capacity -----------------------------------------------------------------------
    def set_capacity(self, replica: int, capacity: BackendCapacity) -> None:
        with self.lock:
            self._set_capacity(replica, capacity)

    def _set_capacity(self, replica: int, capacity: BackendCapacity) -> None:
        state = self.replicas[replica]
        state.capacity = capacity
        state.limit = math.floor(capacity.num_available_blocks * self.safety_factor)
        tokens = capacity.num_blocks * capacity.block_size
        chars = tokens * self.routing.chars_per_token
        self.index.set_cap(replica, chars // self.routing.chunk_chars)

    def set_safety_factor(self, safety_factor: float) -> None:
        with self.lock:
            self.safety_factor = safety_factor
            for i, state in enumerate(self.replicas):
                if state.capacity is not None:
                    self._set_capacity(i, state.capacity)

    def up(self) -> list[int]:
        with self.lock:
            return [i for i, state in enumerate(self.replicas) if state.up]

    # -- placement (governor.placement; called under the admission lock) --------------
    def max_blocks(self) -> int:
        with self.lock:
            return max((s.limit for s in self.replicas if s.up), default=0)

    def can_place(self, budget: str, num_blocks: int) -> bool:
        with self.lock:
            return bool(self._fits(budget, num_blocks))

    def place(self, budget: str, num_blocks: int) -> None:
        with self.lock:
            entry = self.budgets.setdefault(budget, _Budget(max_blocks=num_blocks))
            entry.placed, entry.reserved = True, 0
            fits = self._fits(budget, num_blocks)
            if entry.replica not in fits:  # its own replica first: its context is there
                entry.replica = self._freest(fits or self._up(), budget)
            entry.reserved = num_blocks

    def unplace(self, budget: str) -> None:
        with self.lock:
            entry = self.budgets.get(budget)
            if entry is not None:
                entry.reserved = 0
                if not entry.opened:  # released (or parked) before its first call
                    del self.budgets[budget]

    # -- budgets ------------------------------------------------------------------------
    def open(self, budget: str, max_blocks: int) -> None:
        with self.lock:
            entry = self.budgets.setdefault(budget, _Budget(max_blocks=max_blocks))
            entry.max_blocks, entry.opened = max_blocks, True

    def resize(self, budget: str, max_blocks: int) -> int | None:
        """The replica to resize it on (None: not open on one yet)."""
        with self.lock:
            entry = self.budgets.get(budget)
            if entry is None:
                return None
            entry.max_blocks = max_blocks
            return entry.opened_on

    def close(self, budget: str) -> int | None:
        """Forget the budget; the replica to close it on (None: never opened on one)."""
        with self.lock:
            entry = self.budgets.pop(budget, None)
            return None if entry is None else entry.opened_on

    def where(self) -> dict[str, int | None]:
        with self.lock:
            return {name: entry.opened_on for name, entry in self.budgets.items()}

    def opened_on(self, budget: str) -> int | None:
        """Where the budget's KV is (None: nowhere, or on a replica out of rotation)."""
        with self.lock:
            entry = self.budgets.get(budget)
            if entry is None or entry.opened_on is None:
                return None
            return entry.opened_on if self.replicas[entry.opened_on].up else None

    def opened(self, budget: str, replica: int) -> None:
        with self.lock:
            entry = self.budgets.get(budget)
            if entry is not None:
                entry.opened_on = replica

    # -- a call -------------------------------------------------------------------------
    def route(
        self,
        budget: str | None,
        text: str,
        salt: str | None,
        token_ids: Sequence[int] | None = None,
    ) -> Move | None:
        """The replica a call goes to, and the budget's move first; None: none in rotation.
        Counts the call in flight there (``finished`` ends it). ``token_ids``: the prompt's,
        where the call sends ids (matched against ``kv_events``, when set)."""
        with self.lock:
            entry = None if budget is None else self.budgets.get(budget)
            chain = self.index.chain(text, salt)
            if entry is not None and entry.opened_on is not None:
                target = entry.replica if entry.replica is not None else entry.opened_on
                if self.replicas[target].up:  # affinity (or the move a placement made)
                    move = Move(target)
                    if target != entry.opened_on:
                        move = Move(target, target, entry.opened_on, entry.max_blocks)
                        entry.opened_on = None
                    return self._send(move, chain)
                entry.opened_on = None  # its replica left rotation
            candidates = self._candidates(budget, entry)
            if not candidates:
                return None
            matched, total = self._matcher(chain, len(text), token_ids, salt)
            target = self._choose(candidates, matched, total, budget or "")
            if entry is None:
                return self._send(Move(target), chain)
            entry.replica = target
            return self._send(Move(target, target, None, entry.max_blocks), chain)

    def finished(self, replica: int) -> None:
        with self.lock:
            self.replicas[replica].in_flight -= 1

    def _send(self, move: Move, chain: list[int]) -> Move:
        self.replicas[move.replica].in_flight += 1
        self.index.insert(move.replica, chain)
        return move

    def _candidates(self, budget: str | None, entry: _Budget | None) -> list[int]:
        if entry is not None and entry.placed and entry.reserved:
            fits = self._fits(budget or "", entry.reserved)
            if fits:
                return fits
        if entry is not None and not entry.placed:
            fits = self._fits(budget or "", entry.max_blocks)
            if fits:
                return fits
        return self._up()  # nowhere it fits: the engines' own limits hold it back

    def _matcher(
        self,
        chain: list[int],
        num_chars: int,
        token_ids: Sequence[int] | None,
        salt: str | None,
    ) -> tuple[Callable[[int], int], int]:
        """How much of the prompt each replica holds, and out of how much: tokens, from
        the engines' own events where there are some (the blocks stored under the salt
        the engine is sent for this call's), else characters from the record."""
        events = self.kv_events
        if events is not None and token_ids is not None:
            sent = self.sent_salt or (lambda _replica, salt: salt)

            def matched(i: int) -> int:
                return events.matched_tokens(i, token_ids, cache_salt=sent(i, salt))

            return matched, len(token_ids)
        return (lambda i: self.index.matched(i, chain)), num_chars

    def _choose(
        self, candidates: list[int], matching: Callable[[int], int], total: int, budget: str
    ) -> int:
        if self.routing.policy == "round_robin":
            return candidates[next(self._turn) % len(candidates)]
        load = {i: self.replicas[i].in_flight for i in candidates}
        high, low = max(load.values()), min(load.values())
        rule = self.routing
        if high - low > rule.balance_abs_threshold and high > rule.balance_rel_threshold * low:
            return min(candidates, key=lambda i: (load[i], -self._free(i, budget)))
        matched = {i: matching(i) for i in candidates}
        best = max(candidates, key=lambda i: (matched[i], self._free(i, budget)))
        if total and matched[best] / total > rule.cache_threshold:
            return best
        freest = self._freest(candidates, budget)
        assert freest is not None  # candidates is not empty: max() took one above
        return freest

    # -- failover -----------------------------------------------------------------------
    def down(self, replica: int) -> list[str] | None:
        """Take the replica out of rotation (None: it was out already). Its budgets are
        placed elsewhere, opened again at their next call; returns those it had open."""
        with self.lock:
            state = self.replicas[replica]
            if not state.up:
                return None
            state.up = False
            state.next_probe = time.monotonic() + self.routing.probe_interval_s
            self._forget_cache(replica)
            was_open = []
            for name, entry in self.budgets.items():
                if entry.opened_on == replica:
                    entry.opened_on = None
                    was_open.append(name)
                if entry.replica == replica:
                    others = self._fits(name, entry.reserved) or self._up()
                    entry.replica = self._freest(others, name)
            return was_open

    def due_for_probe(self) -> list[int]:
        """Replicas out of rotation whose probe is due (each given to one caller)."""
        now = time.monotonic()
        with self.lock:
            due = [i for i, s in enumerate(self.replicas) if not s.up and s.next_probe <= now]
            for i in due:
                self.replicas[i].next_probe = now + self.routing.probe_interval_s
            return due

    def back(self, replica: int) -> None:
        with self.lock:
            self.replicas[replica].up = True

    def lost_cache(self, replica: int) -> list[str]:
        """The replica restarted: nothing is cached there; the budgets open on it (set
        up again by the replica's own client, their KV gone)."""
        with self.lock:
            self._forget_cache(replica)
            return [name for name, b in self.budgets.items() if b.opened_on == replica]

    # -- under the lock ---------------------------------------------------------------
    def _forget_cache(self, replica: int) -> None:
        self.index.drop(replica)
        if self.kv_events is not None:
            self.kv_events.clear(replica)

    def _up(self) -> list[int]:
        return [i for i, state in enumerate(self.replicas) if state.up]

    def _charged(self, replica: int, exclude: str) -> int:
        total = 0
        for name, entry in self.budgets.items():
            if name == exclude:
                continue
            if entry.placed:
                total += entry.reserved if entry.replica == replica else 0
            elif entry.opened_on == replica:
                total += entry.max_blocks
        return total

    def _free(self, replica: int, budget: str = "") -> int:
        """Blocks the replica has left for ``budget`` (its own reservation not counted)."""
        return self.replicas[replica].limit - self._charged(replica, budget)

    def _fits(self, budget: str, num_blocks: int) -> list[int]:
        return [
            i for i in self._up() if self._charged(i, budget) + num_blocks <= self.replicas[i].limit
        ]

    def _freest(self, candidates: list[int], budget: str = "") -> int | None:
        """The most free blocks; then the least text cached (a new prefix evicts the least
        there, SGLang's smallest tree), the fewest calls in flight, the first."""
        if not candidates:
            return None
        return max(
            candidates,
            key=lambda i: (
                self._free(i, budget),
                -self.index.size(i),
                -self.replicas[i].in_flight,
                -i,
            ),
        )
