"""Fair share per tenant: tenants take turns, whoever holds the fewest active leases first.

``FairShare`` ranks each waiting lease by its tenant's active leases plus its place
among that tenant's waiting leases (0 for the tenant's first), and tries the lowest
rank first. Within one admission pass that is an exact round-robin that starts with
the tenants holding least: with three free slots, tenant A waiting with five leases and
B with one, nothing active, A's first, B's and A's second are admitted (ranks 0, 0, 1).
As slots free one at a time, each goes to the tenant holding the fewest active leases,
so tenants alternate instead of the earliest burst taking every slot. The share is of
the leases active at once and the policy keeps no history: when nothing is active (one
slot, each lease done before the next starts), ranks tie and arrival decides.

- The share is counted in active leases, not blocks: the caps (``max_per_tenant``)
  count leases too, and counting blocks would favour tenants of small leases.
- Within a tenant: higher ``priority`` first, then ``arrival``.
- Between tenants of equal rank: earlier ``arrival`` first; priority does not break
  these ties, so a tenant cannot win its turns by marking all its work urgent.
- Leases without a tenant (``tenant=None``) share as one tenant.
- There is no aging: no tenant starves, but a low-priority lease can wait behind its
  own tenant's stream of higher-priority work.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from governor import Lease

__all__ = ["FairShare"]


@dataclass(frozen=True, slots=True)
class FairShare:
    """An ``AdmissionPolicy``: tenants in turn, fewest active leases first."""

    def order(
        self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float
    ) -> list[Lease]:
        num_active = Counter(lease.tenant for lease in active)
        by_tenant: defaultdict[str | None, list[Lease]] = defaultdict(list)
        for lease in waiting:
            by_tenant[lease.tenant].append(lease)
        ranked: list[tuple[int, int, Lease]] = []
        for tenant, leases in by_tenant.items():
            leases.sort(key=lambda lease: (-lease.priority, lease.arrival))
            start = num_active[tenant]
            ranked += ((start + i, lease.arrival, lease) for i, lease in enumerate(leases))
        ranked.sort(key=lambda entry: entry[:2])
        return [lease for _, _, lease in ranked]
