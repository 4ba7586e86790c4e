"""``LeaseContext``: what ``Governor.lease`` returns, for ``with`` and ``async with``.

Entering waits for admission (``LeaseLifecycle.acquire``, or ``aacquire`` on an event
loop); leaving releases the lease, whatever ended the block (``release``, or
``arelease``, which closes its engine budget on a worker thread).
"""

from __future__ import annotations

from types import TracebackType

from governor.lease import Lease
from governor.lifecycle import LeaseLifecycle

__all__ = ["LeaseContext"]


class LeaseContext:
    """What ``Governor.lease`` returns: a context manager for ``with`` and ``async with``."""

    __slots__ = ("lease", "lifecycle")

    def __init__(self, lifecycle: LeaseLifecycle, lease: Lease) -> None:
        self.lifecycle = lifecycle
        self.lease = lease

    def __enter__(self) -> Lease:
        return self.lifecycle.acquire(self.lease)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.lifecycle.release(self.lease, error=exc)

    async def __aenter__(self) -> Lease:
        return await self.lifecycle.aacquire(self.lease)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.lifecycle.arelease(self.lease, error=exc)
