"""``AsyncHttp11Transport``: kvgov's HTTP/1.1 transport for an event loop
(``backends.http._http11`` says why and what it covers).

A connection is an ``asyncio.Protocol``: the loop hands it bytes as they arrive and a
reader waits on one future per read. One transport belongs to one event loop, as an
``httpx.AsyncClient`` does.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator

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

__all__ = ["AsyncHttp11Transport"]

_HIGH_WATER = 1 << 20  # bytes buffered unread before the socket stops being read


class AsyncHttp11Transport(httpx.AsyncBaseTransport):
    def __init__(
        self, limits: httpx.Limits | None = None, *, answer_limits: AnswerLimits | None = None
    ) -> None:
        self.limits = PoolLimits.of(limits)
        self.answer_limits = answer_limits or AnswerLimits()
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open = 0  # connections open or being opened, idle ones included
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = key_of(request.url, self._closed, request)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = await request.aread()
        connection = await self._answered(
            key, request.method, head(request, len(body)), body, timeouts, request
        )
        return connection.response(_Body(self, connection, key, timeouts.get("read"), request))

    async def exchange(
        self, method: str, url: httpx.URL, written: bytes, timeouts: dict[str, float | None]
    ) -> Reply:
        """``Http11Transport.exchange`` on the loop: a request written whole (head and body),
        its answer read whole into one ``Reply``, no httpx request, stream or hold on the
        way; ``AnswerRefused`` for a body past ``answer_limits.max_body_bytes``."""
        key = key_of(url, self._closed, None)
        connection = await self._answered(key, method, written, b"", timeouts, None)
        try:
            content = await connection.read_all(timeouts.get("read"), None)
            response = connection.whole_response(content)
        except BaseException:
            self._discard(connection)
            raise
        self._checkin(key, connection)
        return response

    async def aclose(self) -> None:
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    async def _answered(
        self,
        key: tuple[str, int],
        method: str,
        head: bytes,
        body: bytes,
        timeouts: dict[str, float | None],
        request: httpx.Request | None,
    ) -> _Connection:
        """A connection that has sent ``head`` and ``body`` (a ``method`` request) and read
        its answer's head."""
        connection = await self._checkout(key, timeouts, request)
        try:
            connection.send(head, body)
            await connection.drain(timeouts.get("write"), request)
            await connection.wait_headers(method, timeouts.get("read"), request)
        except BaseException:
            self._discard(connection)
            raise
        return connection

    # -- the pool -------------------------------------------------------------------------
    async def _checkout(
        self,
        key: tuple[str, int],
        timeouts: dict[str, float | None],
        request: httpx.Request | None,
    ) -> _Connection:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.reusable(now, self.limits.keepalive_expiry):
                return connection
            self._discard(connection)
        await self._slot(timeouts.get("pool"), request)
        try:
            return await _connect(key, timeouts.get("connect"), request, self.answer_limits)
        except BaseException:
            self._release_slot()
            raise

    async def _slot(self, timeout: float | None, request: httpx.Request | None) -> None:
        if self.limits.max_connections is None or self._open < self.limits.max_connections:
            self._open += 1
            return
        while self._idle_total():  # an idle connection elsewhere gives its slot up
            self._discard(next(c for cs in self._idle.values() for c in cs))
            if self._open < self.limits.max_connections:
                self._open += 1
                return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            raise httpx.PoolTimeout("no connection came free in time", request=request) from None
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release_slot()  # handed over just as this waiter gave up
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _idle_total(self) -> int:
        return sum(len(connections) for connections in self._idle.values())

    def _checkin(self, key: tuple[str, int], connection: _Connection) -> None:
        if self._closed or self._waiters or not connection.keep_alive:
            self._discard(connection)  # a waiter gets the slot; else the pool keeps it
            return
        idle = self._idle.setdefault(key, [])
        if (
            self.limits.max_keepalive is not None
            and self._idle_total() >= self.limits.max_keepalive
        ):
            self._discard(connection)
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)

    def _discard(self, connection: _Connection) -> None:
        for connections in self._idle.values():
            if connection in connections:
                connections.remove(connection)
        connection.close()
        self._release_slot()

    def _release_slot(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to it: _open stays
                return
        self._open -= 1


class _Connection(Answer, asyncio.Protocol):
    """One TCP connection on an event loop: the loop hands it bytes as they arrive."""

    def __init__(self, limits: AnswerLimits) -> None:
        super().__init__(limits)
        self.transport: asyncio.Transport | None = None
        self._lost = False
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP stream's: a Transport

    def data_received(self, data: bytes) -> None:
        try:
            self._feed(data)
        except httpx.RemoteProtocolError as exc:
            self._fail(exc)
            return
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._ended()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._wake()

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # -- the transport's side -------------------------------------------------------------
    def reusable(self, now: float, expiry: float | None) -> bool:
        fresh = expiry is None or now - self.idle_since < expiry
        return (
            fresh
            and not self._lost
            and self.transport is not None
            and not (self.transport.is_closing())
        )

    def send(self, head: bytes, body: bytes) -> None:
        self._next_answer()
        assert self.transport is not None
        self.transport.write(head + body if len(body) < 65_536 else head)
        if len(body) >= 65_536:
            self.transport.write(body)

    async def drain(self, timeout: float | None, request: httpx.Request | None) -> None:
        writable = self._writable
        if writable is None or writable.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(writable), timeout)
        except asyncio.TimeoutError:
            raise httpx.WriteTimeout("the request was not written in time", request=request) from (
                None
            )

    async def wait_headers(
        self, method: str, timeout: float | None, request: httpx.Request | None
    ) -> None:
        while not self._headers_done:
            await self._next(timeout, request)
        self._headers_read(method)

    async def read(self, timeout: float | None, request: httpx.Request | None) -> bytes | None:
        """The next body bytes; None at the end of the answer (an error, such as bytes
        after it, is raised once what came before it has been read)."""
        while not self._chunks:
            if self._complete and self._error is None:
                return None
            await self._next(timeout, request)
        chunk = self._take()
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    async def read_all(self, timeout: float | None, request: httpx.Request | None) -> bytes:
        """The rest of the body, to the end of the answer; ``AnswerRefused`` past
        ``max_body_bytes``, read no further."""
        parts: list[bytes] = []
        num_bytes = 0
        while (chunk := await self.read(timeout, request)) is not None:
            num_bytes += len(chunk)
            if num_bytes > self.limits.max_body_bytes:
                raise refused_body(self.limits.max_body_bytes, num_bytes)
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def _next(self, timeout: float | None, request: httpx.Request | None) -> None:
        """Wait for the loop to hand over more bytes, the end, or an error."""
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        except _Expired:
            raise httpx.ReadTimeout("no answer in time", request=request) from None
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        if self._error is not None:
            raise self._error

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Expired(Exception):
    """A read's timer went off before the loop handed over any bytes."""


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(_Expired())


class _Body(Hold, httpx.AsyncByteStream):
    """An answer's body as it arrives, on the event loop."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            raise httpx.StreamClosed()
        try:
            while (chunk := await connection.read(self._timeout, self._request)) is not None:
                yield chunk
        except BaseException:
            await self.aclose()  # a failed or abandoned read: the connection is closed
            raise

    async def aclose(self) -> None:
        self._end()


async def _connect(
    key: tuple[str, int], timeout: float | None, request: httpx.Request | None, limits: AnswerLimits
) -> _Connection:
    loop = asyncio.get_running_loop()
    opened = loop.create_connection(lambda: _Connection(limits), *key)
    try:
        _, connection = await asyncio.wait_for(opened, timeout)
    except asyncio.TimeoutError:
        message = f"no connection to {key[0]}:{key[1]} in time"
        raise httpx.ConnectTimeout(message, request=request) from None
    except OSError as exc:
        raise httpx.ConnectError(str(exc), request=request) from exc
    return connection
