"""``FanoutLimiter``: at most ``max_fanout`` children of one parent active at once.

One limiter, keyed by the parent's id, is shared by everything that spawns sub-agents, so
a cap holds across subgraphs, threads and event loops. Waiters are served first in, first
out; a freed slot passes straight to the next waiter, so ``on_first_child`` and
``on_last_child`` (the governor parks and resumes the parent) fire exactly once per busy
period. A waiter that times out or is cancelled leaves nothing behind. Fan-out in a
lease's life: docs/design/lease-life.md.

Errors::

    GovernorError
    └── FanoutTimeout      no slot within timeout_s; also a TimeoutError
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from governor.errors import ConfigError, GovernorError
from governor.wakeup import wake

__all__ = ["FanoutLimiter", "FanoutSlot", "FanoutTimeout"]

ParentHook = Callable[[Hashable], None]


class FanoutTimeout(GovernorError, TimeoutError):
    """A child of ``parent_id`` found no slot within ``timeout_s`` seconds.

    A ``TimeoutError`` too, so code that already handles timeouts handles this one.
    """

    def __init__(self, parent_id: Hashable, *, max_fanout: int, timeout_s: float) -> None:
        self.parent_id = parent_id
        self.max_fanout = max_fanout
        self.timeout_s = timeout_s
        super().__init__(
            f"no fan-out slot for a child of {parent_id!r} within {timeout_s:g} s (all "
            f"{max_fanout} busy); raise max_fanout if the budget allows it (see "
            "check_topology), wait longer (timeout_s), or spawn fewer children at once"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # OSError's __new__ ignores the message when a subclass defines __init__, so
        # GovernorError's reduce would lose it: rebuild from the fields instead.
        return (_rebuild_timeout, (self.parent_id, self.max_fanout, self.timeout_s))


def _rebuild_timeout(parent_id: Hashable, max_fanout: int, timeout_s: float) -> FanoutTimeout:
    return FanoutTimeout(parent_id, max_fanout=max_fanout, timeout_s=timeout_s)


class _ThreadWaiter:
    """A thread waiting for a slot. ``granted`` is written under the limiter's lock."""

    __slots__ = ("event", "granted")

    def __init__(self) -> None:
        self.granted = False
        self.event = threading.Event()

    def wake(self) -> bool:
        """Tell the waiter it holds a slot; False when it can no longer be told."""
        self.event.set()
        return True


class _AsyncWaiter:
    """A coroutine waiting for a slot, woken through its own loop from any thread."""

    __slots__ = ("future", "granted", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.granted = False
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def wake(self) -> bool:
        return wake(self.loop, self.future)  # False: its loop is closed, nobody takes it


_Waiter = _ThreadWaiter | _AsyncWaiter


@dataclass(slots=True)
class _Parent:
    max_fanout: int
    active: int = 0
    peak: int = 0
    waiters: deque[_Waiter] = field(default_factory=deque)


class FanoutLimiter:
    """Caps the children active at once per parent; safe across threads and loops.

    ``on_first_child(parent_id)`` runs when a parent's active count goes from 0 to 1,
    ``on_last_child(parent_id)`` when it goes from 1 to 0. Both run under the limiter's
    lock, so one parent's transitions are always seen in order; keep them quick
    (bookkeeping, scheduling an offload) and never wait on a slot inside them. If
    ``on_first_child`` raises, the child gets no slot and the error propagates.
    """

    def __init__(
        self,
        *,
        on_first_child: ParentHook | None = None,
        on_last_child: ParentHook | None = None,
    ) -> None:
        self._lock = threading.RLock()  # re-entrant: hooks may read the counters
        self._parents: dict[Hashable, _Parent] = {}
        self._on_first_child = on_first_child
        self._on_last_child = on_last_child

    def slot(
        self, parent_id: Hashable, max_fanout: int, *, timeout_s: float | None = None
    ) -> FanoutSlot:
        """A slot for one child of ``parent_id``, taken with ``with`` or ``async with``.

        Every child of one parent must pass the same ``max_fanout`` while any of them
        is active or waiting. ``timeout_s`` (None: wait forever) bounds the wait; past
        it ``FanoutTimeout`` is raised.
        """
        if isinstance(max_fanout, bool) or not isinstance(max_fanout, int) or max_fanout < 1:
            raise ConfigError.below_minimum("max_fanout", max_fanout, 1)
        if timeout_s is not None and not timeout_s >= 0:  # also refuses NaN
            raise ConfigError(
                f"timeout_s must be a number of seconds >= 0 or None, got {timeout_s!r}",
                setting="timeout_s",
            )
        return FanoutSlot(self, parent_id, max_fanout, timeout_s)

    def active(self, parent_id: Hashable) -> int:
        """Children of ``parent_id`` holding a slot now."""
        with self._lock:
            entry = self._parents.get(parent_id)
            return 0 if entry is None else entry.active

    def waiting(self, parent_id: Hashable) -> int:
        """Children of ``parent_id`` waiting for a slot now."""
        with self._lock:
            entry = self._parents.get(parent_id)
            return 0 if entry is None else len(entry.waiters)

    def peak(self, parent_id: Hashable) -> int:
        """The most children of ``parent_id`` active at once in its current busy period
        (0 once it has none active or waiting: idle parents are forgotten)."""
        with self._lock:
            entry = self._parents.get(parent_id)
            return 0 if entry is None else entry.peak

    @property
    def num_parents(self) -> int:
        """Parents with children active or waiting now."""
        with self._lock:
            return len(self._parents)

    def _try_acquire(self, parent_id: Hashable, max_fanout: int, waiter: _Waiter) -> bool:
        """Take a slot now (True), or queue ``waiter`` for one (False)."""
        with self._lock:
            entry = self._parents.get(parent_id)
            if entry is None:
                entry = self._parents[parent_id] = _Parent(max_fanout=max_fanout)
            elif entry.max_fanout != max_fanout:
                raise ConfigError(
                    f"children of {parent_id!r} are running with max_fanout="
                    f"{entry.max_fanout}, this one asked for {max_fanout}; pass the same "
                    "max_fanout for every child of one parent",
                    setting="max_fanout",
                )
            if entry.active < max_fanout and not entry.waiters:  # never overtake a waiter
                entry.active += 1
                entry.peak = max(entry.peak, entry.active)
                if entry.active == 1 and self._on_first_child is not None:
                    try:
                        self._on_first_child(parent_id)
                    except BaseException:
                        del self._parents[parent_id]  # it had no other child
                        raise
                return True
            entry.waiters.append(waiter)
            return False

    def _abandon(self, parent_id: Hashable, waiter: _Waiter, *, keep_grant: bool) -> bool:
        """A waiter gives up. Returns True when it holds a slot and keeps it (a grant
        that landed as the deadline passed); otherwise no trace of it is left."""
        with self._lock:
            if waiter.granted:
                if keep_grant:
                    return True
                self._release(parent_id)
                return False
            entry = self._parents[parent_id]
            entry.waiters.remove(waiter)
            if entry.active == 0 and not entry.waiters:
                del self._parents[parent_id]
            return False

    def _release(self, parent_id: Hashable) -> None:
        with self._lock:
            entry = self._parents[parent_id]
            # Hand the slot straight to the next waiter: active stays put, no hooks fire.
            while entry.waiters:
                waiter = entry.waiters.popleft()
                waiter.granted = True
                if waiter.wake():
                    return
                waiter.granted = False
            entry.active -= 1
            assert entry.active >= 0, "a slot was released twice"
            if entry.active == 0:
                del self._parents[parent_id]
                if self._on_last_child is not None:
                    self._on_last_child(parent_id)


class FanoutSlot:
    """One child's slot from ``FanoutLimiter.slot``; held inside its ``with`` block.
    It may be entered again after it exits, never twice at once."""

    __slots__ = ("_held", "_limiter", "_max_fanout", "_parent_id", "_timeout_s")

    def __init__(
        self, limiter: FanoutLimiter, parent_id: Hashable, max_fanout: int, timeout_s: float | None
    ) -> None:
        self._limiter = limiter
        self._parent_id = parent_id
        self._max_fanout = max_fanout
        self._timeout_s = timeout_s
        self._held = False

    def __enter__(self) -> FanoutSlot:
        self._check_free()
        waiter = _ThreadWaiter()
        if not self._limiter._try_acquire(self._parent_id, self._max_fanout, waiter):
            try:
                woken = waiter.event.wait(self._timeout_s)
            except BaseException:
                self._limiter._abandon(self._parent_id, waiter, keep_grant=False)
                raise
            if not woken and not self._limiter._abandon(self._parent_id, waiter, keep_grant=True):
                raise self._timeout()
        self._held = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._held = False
        self._limiter._release(self._parent_id)

    async def __aenter__(self) -> FanoutSlot:
        self._check_free()
        waiter = _AsyncWaiter(asyncio.get_running_loop())
        if not self._limiter._try_acquire(self._parent_id, self._max_fanout, waiter):
            try:
                await asyncio.wait_for(waiter.future, self._timeout_s)
            except asyncio.TimeoutError:
                if not self._limiter._abandon(self._parent_id, waiter, keep_grant=True):
                    raise self._timeout() from None
            except BaseException:  # cancelled: pass on any slot granted meanwhile
                self._limiter._abandon(self._parent_id, waiter, keep_grant=False)
                raise
        self._held = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def _check_free(self) -> None:
        if self._held:
            raise ConfigError(
                f"this fan-out slot of {self._parent_id!r} is already held; take one "
                "limiter.slot() per child",
                setting="slot",
            )

    def _timeout(self) -> FanoutTimeout:
        assert self._timeout_s is not None
        return FanoutTimeout(
            self._parent_id, max_fanout=self._max_fanout, timeout_s=self._timeout_s
        )
