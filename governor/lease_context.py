"""``LeaseContext``: what ``Governor.lease`` returns, for ``with`` and ``async with``.

Entering waits for admission (``acquire``, or ``aacquire`` on an event loop); leaving
releases the lease, whatever ended the block (``release``, or ``arelease``, which
closes its engine budget on a worker thread).
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from governor.lease import Lease

if TYPE_CHECKING:
    from governor.governor import Governor

__all__ = ["LeaseContext"]


class LeaseContext:
    """What ``Governor.lease`` returns: a context manager for ``with`` and ``async with``."""

    __slots__ = ("governor", "lease")

    def __init__(self, governor: Governor, lease: Lease) -> None:
        self.governor = governor
        self.lease = lease

    def __enter__(self) -> Lease:
        return self.governor.acquire(self.lease)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.governor.release(self.lease, error=exc)

    async def __aenter__(self) -> Lease:
        return await self.governor.aacquire(self.lease)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.governor.arelease(self.lease, error=exc)
