"""What ``kvgov serve`` refuses before it reaches the engine: bodies over
``max_body_bytes`` (413) and model calls while the engine's waiting queue is full (429).

``kvgov.serve.gateway`` checks ``Content-Length`` before reading anything
(``declared_length``), and counts the bytes of every body as they arrive, a body sent
without one (chunked) included: the first byte over the limit ends the request with 413
(``BodyTooLarge``), whatever the route was doing with the body.

``QueueGate`` counts the model calls in flight through this server. While there are
fewer than ``max_waiting_requests`` of them the engine's queue cannot be full, and a call
goes ahead without asking the engine anything; past that it reads the engine's waiting
count (from a worker thread) and refuses with 429 and ``Retry-After`` while it is at the
limit. The count lives on the event loop's thread only: no lock.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from governor.local_backend import LocalBackend
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

    async def enter(self) -> None:
        """Count a model call in, or refuse it with 429 while the queue is full."""
        if self.num_in_flight >= self.max_waiting_requests:
            metrics = await asyncio.to_thread(self.backend.metrics)
            if metrics.num_requests_waiting >= self.max_waiting_requests:
                raise ApiError(
                    429,
                    f"{metrics.num_requests_waiting} requests are waiting for the engine, the "
                    f"most this server queues (--max-waiting {self.max_waiting_requests}); "
                    f"retry after {RETRY_AFTER_S} s",
                    code="queue_full",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                )
        self.num_in_flight += 1

    def leave(self) -> None:
        self.num_in_flight -= 1
