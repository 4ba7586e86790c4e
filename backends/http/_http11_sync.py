"""``Http11Transport``: kvgov's HTTP/1.1 transport for threads
(``backends.http._http11`` says why and what it covers).

Blocking sockets, each connection read and written by the one thread that has it
checked out, the pool under a lock (never held across I/O).
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator

import httpx

from backends.http._http11 import (
    Answer,
    AnswerLimits,
    Hold,
    PoolLimits,
    Reply,
    head,
    key_of,
    refused_body,
)

__all__ = ["Http11Transport"]

_READ_SIZE = 1 << 16


class Http11Transport(httpx.BaseTransport):
    """``AsyncHttp11Transport`` for threads: blocking sockets, each connection used by one
    thread at a time, the pool under a lock. httpcore and h11 spend about 0.3 ms of
    client CPU a call on this host for what a socket read and llhttp do here."""

    def __init__(
        self, limits: httpx.Limits | None = None, *, answer_limits: AnswerLimits | None = None
    ) -> None:
        self.limits = PoolLimits.of(limits)
        self.answer_limits = answer_limits or AnswerLimits()
        self._lock = threading.Condition()  # the pool below; never held across I/O
        self._idle: dict[tuple[str, int], list[_SyncConnection]] = {}
        self._open = 0  # connections open or being opened, idle ones included
        self._closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = key_of(request.url, self._closed, request)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = request.read()
        written = head(request, len(body)) + body
        connection = self._answered(key, request.method, written, timeouts, request)
        return connection.response(_SyncBody(self, connection, key, timeouts.get("read"), request))

    def exchange(
        self, method: str, url: httpx.URL, written: bytes, timeouts: dict[str, float | None]
    ) -> Reply:
        """A ``method`` request written whole (head and body, as ``head`` writes them) sent to
        ``url``'s server, and its answer read whole, as one ``Reply`` with its content
        (decoded where it is encoded): what ``handle_request`` and reading the response do
        for a call that is not streamed, less the request, stream and hold objects they go
        through (about a tenth of a served call's client CPU). Errors are
        ``handle_request``'s, less the request they would name, and ``AnswerRefused`` for
        a body past ``answer_limits.max_body_bytes``."""
        key = key_of(url, self._closed, None)
        connection = self._answered(key, method, written, timeouts, None)
        try:
            content = connection.read_all(timeouts.get("read"), None)
            response = connection.whole_response(content)
        except BaseException:
            self._discard(connection)
            raise
        self._checkin(key, connection)
        return response

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [c for connections in self._idle.values() for c in connections]
            self._idle.clear()
            self._open -= len(idle)
            self._lock.notify_all()
        for connection in idle:
            connection.close()

    def _answered(
        self,
        key: tuple[str, int],
        method: str,
        written: bytes,
        timeouts: dict[str, float | None],
        request: httpx.Request | None,
    ) -> _SyncConnection:
        """A connection that has sent ``written`` (a ``method`` request) and read its
        answer's head."""
        connection = self._checkout(key, timeouts, request)
        try:
            connection.send(written, timeouts.get("write"), request)
            connection.wait_headers(method, timeouts.get("read"), request)
        except BaseException:
            self._discard(connection)
            raise
        return connection

    def _checkout(
        self,
        key: tuple[str, int],
        timeouts: dict[str, float | None],
        request: httpx.Request | None,
    ) -> _SyncConnection:
        timeout = timeouts.get("pool")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            stale: _SyncConnection | None = None
            with self._lock:
                idle = self._idle.get(key)
                if idle:
                    connection = idle.pop()
                    if connection.reusable(time.monotonic(), self.limits.keepalive_expiry):
                        return connection
                    stale = connection
                elif (
                    self.limits.max_connections is None or self._open < self.limits.max_connections
                ):
                    self._open += 1
                    break
                elif others := [c for cs in self._idle.values() for c in cs]:
                    stale = others[0]  # an idle connection elsewhere gives its slot up
                    for connections in self._idle.values():
                        if stale in connections:
                            connections.remove(stale)
                else:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise httpx.PoolTimeout("no connection came free in time", request=request)
                    self._lock.wait(left)
                    continue
            if stale is not None:
                self._discard(stale)
        try:
            return _SyncConnection.open(key, timeouts.get("connect"), request, self.answer_limits)
        except BaseException:
            with self._lock:
                self._open -= 1
                self._lock.notify()
            raise

    def _checkin(self, key: tuple[str, int], connection: _SyncConnection) -> None:
        with self._lock:
            kept = not self._closed and connection.keep_alive
            total = sum(len(connections) for connections in self._idle.values())
            if kept and (self.limits.max_keepalive is None or total < self.limits.max_keepalive):
                connection.idle_since = time.monotonic()
                self._idle.setdefault(key, []).append(connection)
                self._lock.notify()
                return
        self._discard(connection)

    def _discard(self, connection: _SyncConnection) -> None:
        connection.close()
        with self._lock:
            self._open -= 1
            self._lock.notify()


class _SyncConnection(Answer):
    """One TCP connection read and written by the thread that has it checked out."""

    def __init__(self, sock: socket.socket, limits: AnswerLimits) -> None:
        super().__init__(limits)
        self.sock = sock

    @classmethod
    def open(
        cls,
        key: tuple[str, int],
        timeout: float | None,
        request: httpx.Request | None,
        limits: AnswerLimits,
    ) -> _SyncConnection:
        try:
            sock = socket.create_connection(key, timeout=timeout)
        except TimeoutError:
            message = f"no connection to {key[0]}:{key[1]} in time"
            raise httpx.ConnectTimeout(message, request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock, limits)

    def reusable(self, now: float, expiry: float | None) -> bool:
        """Fresh, and the server has not closed it (nothing to read on an idle one)."""
        if expiry is not None and now - self.idle_since >= expiry:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable  # an idle connection that reads has been closed (or is broken)

    def send(self, written: bytes, timeout: float | None, request: httpx.Request | None) -> None:
        self._next_answer()
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(written)
        except TimeoutError:
            raise httpx.WriteTimeout("the request was not written in time", request=request) from (
                None
            )
        except OSError as exc:
            raise httpx.WriteError(str(exc), request=request) from exc

    def wait_headers(
        self, method: str, timeout: float | None, request: httpx.Request | None
    ) -> None:
        while not self._headers_done:
            self._receive(timeout, request)
        self._headers_read(method)

    def read(self, timeout: float | None, request: httpx.Request | None) -> bytes | None:
        """The next body bytes; None at the end of the answer (an error, such as bytes
        after it, is raised once what came before it has been read)."""
        while not self._chunks:
            if self._complete and self._error is None:
                return None
            self._receive(timeout, request)
        return self._take()

    def read_all(self, timeout: float | None, request: httpx.Request | None) -> bytes:
        """The rest of the body, to the end of the answer; ``AnswerRefused`` past
        ``max_body_bytes``, read no further."""
        parts: list[bytes] = []
        num_bytes = 0
        while (chunk := self.read(timeout, request)) is not None:
            num_bytes += len(chunk)
            if num_bytes > self.limits.max_body_bytes:
                raise refused_body(self.limits.max_body_bytes, num_bytes)
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        self.sock.close()

    def _receive(self, timeout: float | None, request: httpx.Request | None) -> None:
        if self._error is not None:
            raise self._error
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(_READ_SIZE)
        except TimeoutError:
            raise httpx.ReadTimeout("no answer in time", request=request) from None
        except OSError as exc:
            raise httpx.ReadError(str(exc), request=request) from exc
        if data:
            try:
                self._feed(data)
            except httpx.RemoteProtocolError as exc:
                self._error = exc
        else:
            self._ended()
        if self._error is not None:
            raise self._error


class _SyncBody(Hold, httpx.SyncByteStream):
    """An answer's body as it arrives, on the thread that reads it."""

    def __iter__(self) -> Iterator[bytes]:
        connection = self._connection
        if connection is None:
            raise httpx.StreamClosed()
        try:
            while (chunk := connection.read(self._timeout, self._request)) is not None:
                yield chunk
        except BaseException:
            self.close()  # a failed or abandoned read: the connection is closed
            raise

    def close(self) -> None:
        self._end()
