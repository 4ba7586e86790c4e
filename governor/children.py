"""Sub-agents: a child lease taken under its parent's fan-out cap.

``governor.child(parent, agent)`` (``with`` or ``async with``) first takes one of the
parent's fan-out slots (at most the parent agent's ``max_fanout`` children at once,
counted by one limiter shared by every graph, thread and event loop), then the child's
own lease. The parent is parked when its first child starts, so it stops counting
against admission while it waits: a planner with N workers cannot deadlock. It is
resumed when it next calls the model.
"""

from __future__ import annotations

from types import TracebackType

from governor.fanout import FanoutSlot
from governor.lease import Lease
from governor.lease_context import LeaseContext

__all__ = ["ChildContext"]


class ChildContext:
    __slots__ = ("_lease", "_slot", "parent")

    def __init__(self, parent: Lease, slot: FanoutSlot, lease: LeaseContext) -> None:
        self.parent = parent
        self._slot = slot
        self._lease = lease

    @property
    def lease(self) -> Lease:
        return self._lease.lease

    def __enter__(self) -> Lease:
        self._slot.__enter__()
        try:
            return self._lease.__enter__()
        except BaseException:
            self._slot.__exit__(None, None, None)
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._lease.__exit__(exc_type, exc, tb)
        finally:
            self._slot.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> Lease:
        await self._slot.__aenter__()
        try:
            return await self._lease.__aenter__()
        except BaseException:
            await self._slot.__aexit__(None, None, None)
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._lease.__aexit__(exc_type, exc, tb)
        finally:
            await self._slot.__aexit__(exc_type, exc, tb)
