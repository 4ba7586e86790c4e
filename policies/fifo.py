"""Strict first come, first served admission.

``Fifo`` tries the waiting leases in the order they were requested (``Lease.arrival``),
ignoring priority. A parked lease that resumes keeps its original place, ahead of
everything requested after it. With the controller's rule that a lease blocked by memory
holds the line, no lease is ever overtaken while it waits for memory; one blocked only
by a per-agent or per-tenant cap is still passed by later leases.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from governor import Lease

__all__ = ["Fifo"]


@dataclass(frozen=True, slots=True)
class Fifo:
    """An ``AdmissionPolicy``: by ``arrival`` alone, priority ignored."""

    def order(
        self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float
    ) -> list[Lease]:
        return sorted(waiting, key=self.key)

    def key(self, lease: Lease) -> int:
        """A lease's place never changes while it waits: the controller keeps its queue
        in this order instead of calling ``order`` on every pass."""
        return lease.arrival
