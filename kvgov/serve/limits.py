"""What ``kvgov serve`` refuses before it reaches the engine: bodies over
``max_body_bytes`` (413) and model calls while the engine's waiting queue is full (429).

``kvgov.serve.gateway`` checks ``Content-Length`` before reading anything
(``declared_length``), and counts the bytes of every body as they arrive, a body sent
without one (chunked) included: the first byte over the limit ends the request with 413
(``BodyTooLarge``), whatever the route was doing with the body.

``QueueGate`` counts the model calls in flight through this server, in all and per
tenant. While there are fewer than ``max_waiting_requests`` of them the engine's queue
cannot be full, and a call goes ahead without asking the engine anything; past that it
reads the engine's waiting count (from a worker thread) and refuses with 429 and
``Retry-After`` while it is at the limit. A bound tenant (with API keys, a key that is
not an admin's) is refused only once it has its fair share of the calls in flight:
``max_waiting_requests`` split between the tenants calling at that moment (all of it for
one). So one key's flood fills the queue for itself, never for another key, and the
queue holds at most about twice ``max_waiting_requests`` (the flood, and every other
key's share). The counts live on the event loop's thread only: no lock.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from backends.local.backend import LocalBackend
from kvgov.serve.errors import ApiError

__all__ = ["RETRY_AFTER_S", "BodyTooLarge", "QueueGate", "declared_length"]

RETRY_AFTER_S = 1  # a waiting queue at its limit drains within a few engine steps


class BodyTooLarge(ApiError):
    """The 413 of a body over the limit; raised into the route by the body's first byte
    over it, so a route that lets it through answers it as any ``ApiError``."""

    def __init__(self, max_body_bytes: int) -> None:
        super().__init__(
            413,
            f"the body is over this server's limit of {max_body_bytes:,} bytes; send a "
            "shorter request (kvgov serve --max-body-bytes sets the limit)",
            code="request_too_large",
        )


def declared_length(value: bytes | None) -> int | None:
    """A ``Content-Length`` header's value as a number; None without one (or unreadable:
    the body's bytes are counted as they arrive either way)."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


@dataclass(slots=True)
class QueueGate:
    backend: LocalBackend
    max_waiting_requests: int
    num_in_flight: int = 0
    # The calls in flight of each tenant that has any (an entry goes at 0: bounded by the
    # tenants calling at once).
    _num_by_tenant: dict[str, int] = field(default_factory=dict)

    async def enter(self, tenant: str = "", *, bound: bool = False) -> None:
        """Count a model call in, or refuse it with 429 while the queue is full. A
        ``bound`` tenant (a key that is not an admin's) with fewer calls in flight than
        its fair share goes ahead even then."""
        if self.num_in_flight >= self.max_waiting_requests and not (
            bound and self._num_by_tenant.get(tenant, 0) < self.fair_share(tenant)
        ):
            metrics = await asyncio.to_thread(self.backend.metrics)
            if metrics.num_requests_waiting >= self.max_waiting_requests:
                raise self._refusal(metrics.num_requests_waiting, tenant, bound=bound)
        self.num_in_flight += 1
        self._num_by_tenant[tenant] = self._num_by_tenant.get(tenant, 0) + 1

    def leave(self, tenant: str = "") -> None:
        self.num_in_flight -= 1
        left = self._num_by_tenant[tenant] - 1
        if left:
            self._num_by_tenant[tenant] = left
        else:
            del self._num_by_tenant[tenant]

    def fair_share(self, tenant: str) -> int:
        """``max_waiting_requests`` split between the tenants with calls in flight and
        ``tenant``: the calls it may have in flight however full the queue is."""
        return max(1, self.max_waiting_requests // self._num_tenants(tenant))

    def _num_tenants(self, tenant: str) -> int:
        """The tenants calling at once, ``tenant`` among them."""
        return len(self._num_by_tenant) + (tenant not in self._num_by_tenant)

    def _refusal(self, num_waiting: int, tenant: str, *, bound: bool) -> ApiError:
        message = (
            f"{num_waiting} requests are waiting for the engine, the most this server "
            f"queues (--max-waiting {self.max_waiting_requests}); "
        )
        if bound:
            message += (
                f"this API key has {self._num_by_tenant.get(tenant, 0)} calls in flight, "
                f"its share of the queue ({self.fair_share(tenant)}) while "
                f"{self._num_tenants(tenant)} keys call at once; "
            )
        return ApiError(
            429,
            message + f"retry after {RETRY_AFTER_S} s",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
