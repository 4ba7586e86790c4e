"""``Growth``: the part of ``Governor`` that raises a lease's ceiling while it runs.

A lease grows at once when admission has room for its larger reservation
(``AdmissionController.try_grow``, under the admission lock); otherwise it is parked at
the larger size in one step and queued again, and the caller waits to be admitted like
any other lease. The engine budget the lease owns is resized after either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from governor.errors import ConfigError, LeaseReleased
from governor.lease import Lease, LeaseState

if TYPE_CHECKING:
    from governor.admission import AdmissionController
    from governor.backend import Backend

__all__ = ["Growth"]


class Growth:
    """Mixed into ``Governor``; the attributes below, and ``acquire``, ``aacquire``,
    ``_budget_open`` and ``_publish``, are the governor's."""

    admission: AdmissionController
    backend: Backend

    def grow(self, lease: Lease, tokens: int) -> None:
        """Raise the lease's ceiling by ``tokens`` (``Lease.grow``); blocks this thread
        while it waits to be admitted at the larger size. ``agrow`` on an event loop."""
        if not self._grow_now(lease, tokens):
            self.acquire(lease)
        if self._budget_open(lease):
            self.backend.resize_budget(lease.budget, max_blocks=lease.blocks_reserved)

    async def agrow(self, lease: Lease, tokens: int) -> None:
        if not self._grow_now(lease, tokens):
            await self.aacquire(lease)
        if self._budget_open(lease):
            await self.backend.aresize_budget(lease.budget, max_blocks=lease.blocks_reserved)

    def _grow_now(self, lease: Lease, tokens: int) -> bool:
        """Grown at once (True), or parked at the larger size to queue for it (False)."""
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise ConfigError.below_minimum("tokens", tokens, 1)
        if lease.state is LeaseState.RELEASED:
            raise LeaseReleased(lease.lease_id, agent=lease.agent.name)
        ceiling = lease.ceiling_tokens + tokens
        if self.admission.try_grow(lease, ceiling):
            return True
        # Parked at the larger size in one step (under the admission lock), then queued.
        if self.admission.park(lease, ceiling_tokens=ceiling):
            self._publish("parked", lease, reason="grow")
        return False
