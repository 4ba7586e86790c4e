"""``LimitedHttpProtocol``: uvicorn's httptools protocol, with a bound on a request head's
size and on how long its head and body may take to arrive.

uvicorn's own protocols leave a connection unbounded before the app sees a request:
httptools joins a header's pieces as they arrive with no limit (a 300 MiB header was
read whole and answered), nothing times a head out (one header line every 5 s held a
connection for as long as the client liked), and a connection that sends nothing waits
forever. Against those, per connection:

- the head (request line and headers) holds at most ``max_head_bytes``: the bytes read
  while a head is incomplete are counted, and past the limit the request is answered 431
  and the connection closed, so it never holds more than the limit plus one read (256
  KiB, asyncio's largest);
- the head must be whole ``head_timeout_s`` after the connection opened or after its
  first byte (a keep-alive connection's next request), and the body ``body_timeout_s``
  after the head; past either the request is answered 408, where no answer has started,
  and the connection closed (the app sees the client leave).

An idle keep-alive connection is closed by uvicorn's own ``timeout_keep_alive``, and the
number of connections by its ``limit_concurrency`` (503), which ``kvgov serve`` sets
(``kvgov.cli.serve.uvicorn_config``). httptools stays the parser: h11 costs about 0.5 ms
more per request. Everything here runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Literal

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kvgov.serve.errors import error_body

__all__ = ["ConnectionLimits", "LimitedHttpProtocol"]

_Phase = Literal["head", "body"]
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    max_head_bytes: int
    head_timeout_s: float
    body_timeout_s: float


class LimitedHttpProtocol(HttpToolsProtocol):
    """One connection; uvicorn makes one per connection with ``config``, ``server_state``
    and ``app_state``, and ``kvgov.cli.serve.uvicorn_config`` binds ``limits``."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._reading_head = True  # the bytes that arrive belong to a head
        self._num_head_bytes = 0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's own
        super().connection_made(transport)
        self._arm("head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():  # refused already: what was read still arrives
            return
        if self._reading_head:
            self._num_head_bytes += len(data)
        super().data_received(data)
        if self._reading_head and self._num_head_bytes > self.limits.max_head_bytes:
            self._refuse(
                431,
                "request_header_too_large",
                f"the request's head (request line and headers) is over this server's "
                f"limit of {self.limits.max_head_bytes:,} bytes; send fewer or shorter "
                "headers (kvgov serve --max-head-bytes sets the limit)",
            )

    # httptools' callbacks, in the order it makes them for each request
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._timer is None:  # a keep-alive connection's next request
            self._arm("head")

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._disarm()
        super().on_headers_complete()
        self._arm("body")  # until on_message_complete, at once for a body-less request

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()
        self._reading_head = True
        self._num_head_bytes = 0

    # the timer
    def _arm(self, phase: _Phase) -> None:
        self._disarm()
        delay = self.limits.head_timeout_s if phase == "head" else self.limits.body_timeout_s
        self._timer = self.loop.call_later(delay, self._timed_out, phase)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self, phase: _Phase) -> None:
        self._timer = None
        if phase == "head":
            message = (
                f"the request's head did not arrive in {self.limits.head_timeout_s:g} s; "
                "send the whole head at once (kvgov serve --head-timeout sets the limit)"
            )
        else:
            message = (
                f"the request's body did not arrive in {self.limits.body_timeout_s:g} s; "
                "send it as fast as the head (kvgov serve --body-timeout sets the limit)"
            )
        self._refuse(408, "request_timeout", message)

    def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer ``status`` where no answer on this connection has started (else
        the client would read it inside another), then close."""
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            body = json.dumps(error_body(status, message, code=code)).encode()
            head = (
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n"
                % (status, _REASONS[status], len(body))
            )
            self.transport.write(head + body)
        self.transport.close()
