"""What ``kvgov serve`` refuses before it reaches the engine: bodies over
``max_body_bytes`` (413) and model calls while the engine's waiting queue is full (429).

``BodyLimitMiddleware`` checks ``Content-Length`` before reading anything, and counts the
bytes of a body sent without one (chunked) as they arrive: the first byte over the limit
ends the request with 413, whatever the route was doing with the body.

``QueueGate`` counts the model calls in flight through this server. While there are
fewer than ``max_waiting_requests`` of them the engine's queue cannot be full, and a call
goes ahead without asking the engine anything; past that it reads the engine's waiting
count (from a worker thread) and refuses with 429 and ``Retry-After`` while it is at the
limit. The count lives on the event loop's thread only: no lock.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from governor.local_backend import LocalBackend
from kvgov.serve.errors import ApiError

__all__ = ["RETRY_AFTER_S", "BodyLimitMiddleware", "QueueGate"]

RETRY_AFTER_S = 1  # a waiting queue at its limit drains within a few engine steps


class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _refusal(self) -> ApiError:
        return ApiError(
            413,
            f"the body is over this server's limit of {self.max_body_bytes:,} bytes; send a "
            "shorter request (kvgov serve --max-body-bytes sets the limit)",
            code="request_too_large",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._refusal().response()(scope, receive, send)
            return
        received = 0
        over = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    over = True
                    raise _BodyTooLarge()
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over:  # whatever the route made of the cut body, the answer is 413
                return
            started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over and not started:
            await self._refusal().response()(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
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
