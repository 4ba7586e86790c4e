"""``AsyncHttp11Transport``: httpx's async transport for plain-HTTP servers, lean per read.

An answer streamed as server-sent events is one read per event. Through httpx's default
transport each read goes through httpcore, anyio (a timeout scope, a selector
registration and removal) and h11's pure-Python parser: about 0.15 ms of client CPU per
streamed token on the 2-core development machine, more than the server spends on it.
Here a connection is an ``asyncio.Protocol``: the event loop hands it bytes as they
arrive, llhttp (``httptools``, uvicorn's own parser, installed with ``uvicorn[standard]``)
splits them into the status line, headers and body chunks, and a reader waits on one
future per read. What httpx does above a transport (the client, its ``Request`` and
``Response``, content decoding, timeouts and limits as configured) is unchanged.

Scope: ``http://`` only (``Transport`` keeps httpx's own transport for ``https://``, and
httpx's proxy mounts take precedence as they do over any transport), HTTP/1.1 with
keep-alive, one request at a time per connection, ``Content-Length``, chunked or
until-close bodies. Errors are httpx's: ``ConnectError``/``ConnectTimeout`` before the
request is written (a retry cannot do it twice), ``ReadTimeout``, ``WriteTimeout``,
``PoolTimeout``, ``RemoteProtocolError`` for a malformed answer or a connection closed
mid-answer. A connection goes back to the pool only when its answer was read whole and
the server keeps it alive; an answer closed early (a consumer that stopped reading, a
cancelled task) closes its connection, so the server sees the client leave.

One transport belongs to one event loop, as an ``httpx.AsyncClient`` does.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator

import httptools
import httpx

__all__ = ["AsyncHttp11Transport"]

_HIGH_WATER = 1 << 20  # bytes buffered unread before the socket stops being read


class AsyncHttp11Transport(httpx.AsyncBaseTransport):
    def __init__(self, limits: httpx.Limits | None = None) -> None:
        limits = limits or httpx.Limits()
        self._max_connections = limits.max_connections
        self._max_keepalive = limits.max_keepalive_connections
        self._keepalive_expiry = limits.keepalive_expiry
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open = 0  # connections open or being opened, idle ones included
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(
                f"AsyncHttp11Transport speaks plain HTTP only, not {url.scheme!r}; "
                "use httpx's own transport for it"
            )
        if self._closed:
            raise httpx.ConnectError("the transport is closed", request=request)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        key = (url.host, url.port or 80)
        body = await request.aread()
        connection = await self._checkout(key, timeouts, request)
        try:
            connection.send(_head(request, len(body)), body)
            await connection.drain(timeouts.get("write"), request)
            await connection.wait_headers(timeouts.get("read"), request)
        except BaseException:
            self._discard(connection)
            raise
        return httpx.Response(
            connection.status,
            headers=connection.headers,
            stream=_Body(self, connection, key, timeouts.get("read"), request),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": connection.reason},
        )

    async def aclose(self) -> None:
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    # -- the pool -------------------------------------------------------------------------
    async def _checkout(
        self, key: tuple[str, int], timeouts: dict[str, float | None], request: httpx.Request
    ) -> _Connection:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.reusable(now, self._keepalive_expiry):
                return connection
            self._discard(connection)
        await self._slot(timeouts.get("pool"), request)
        try:
            return await _connect(key, timeouts.get("connect"), request)
        except BaseException:
            self._release_slot()
            raise

    async def _slot(self, timeout: float | None, request: httpx.Request) -> None:
        if self._max_connections is None or self._open < self._max_connections:
            self._open += 1
            return
        while self._idle_total():  # an idle connection elsewhere gives its slot up
            self._discard(next(c for cs in self._idle.values() for c in cs))
            if self._open < self._max_connections:
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
        if self._max_keepalive is not None and self._idle_total() >= self._max_keepalive:
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


class _Connection(asyncio.Protocol):
    """One TCP connection: bytes in through llhttp, one answer at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self.idle_since = 0.0
        self._headers_done = False
        self._complete = False
        self._lost = False
        self._error: BaseException | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"a malformed answer: {exc}"))
            return
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._headers_done and not self._complete and self._until_close():
            self._complete = True  # an answer with no length ends where the connection does
        elif not self._complete:
            self._fail(httpx.RemoteProtocolError("the server closed the connection mid-answer"))
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._wake()

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # -- llhttp's callbacks ---------------------------------------------------------------
    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        self._complete = True
        self.keep_alive = self.parser.should_keep_alive()

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
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.reason, self.headers = 0, b"", []
        self._headers_done = self._complete = self.keep_alive = False
        self._chunks.clear()
        self._buffered = 0
        assert self.transport is not None
        self.transport.write(head + body if len(body) < 65_536 else head)
        if len(body) >= 65_536:
            self.transport.write(body)

    async def drain(self, timeout: float | None, request: httpx.Request) -> None:
        writable = self._writable
        if writable is None or writable.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(writable), timeout)
        except asyncio.TimeoutError:
            raise httpx.WriteTimeout("the request was not written in time", request=request) from (
                None
            )

    async def wait_headers(self, timeout: float | None, request: httpx.Request) -> None:
        while not self._headers_done:
            await self._next(timeout, request)
        if request.method == "HEAD":  # its answer has headers only, whatever they say
            self._complete = True
            self.keep_alive = self.parser.should_keep_alive()

    async def read(self, timeout: float | None, request: httpx.Request) -> bytes | None:
        """The next body bytes; None at the end of the answer."""
        while not self._chunks:
            if self._complete:
                return None
            await self._next(timeout, request)
        chunk = self._chunks.popleft()
        while self._chunks:  # what arrived together is read together
            chunk += self._chunks.popleft()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _until_close(self) -> bool:
        names = {name.lower() for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    async def _next(self, timeout: float | None, request: httpx.Request) -> None:
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
    pass


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(_Expired())


class _Body(httpx.AsyncByteStream):
    """An answer's body as it arrives; closing it returns or closes the connection."""

    def __init__(
        self,
        pool: AsyncHttp11Transport,
        connection: _Connection,
        key: tuple[str, int],
        timeout: float | None,
        request: httpx.Request,
    ) -> None:
        self._pool = pool
        self._connection: _Connection | None = connection
        self._key = key
        self._timeout = timeout
        self._request = request

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
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if connection._complete and connection._error is None:
            self._pool._checkin(self._key, connection)
        else:
            self._pool._discard(connection)


async def _connect(
    key: tuple[str, int], timeout: float | None, request: httpx.Request
) -> _Connection:
    loop = asyncio.get_running_loop()
    try:
        _, connection = await asyncio.wait_for(loop.create_connection(_Connection, *key), timeout)
    except asyncio.TimeoutError:
        message = f"no connection to {key[0]}:{key[1]} in time"
        raise httpx.ConnectTimeout(message, request=request) from None
    except OSError as exc:
        raise httpx.ConnectError(str(exc), request=request) from exc
    return connection


def _head(request: httpx.Request, length: int) -> bytes:
    """The request line and headers, as httpx built them (Host, Content-Length...)."""
    target = request.url.raw_path
    lines = [request.method.encode("ascii") + b" " + target + b" HTTP/1.1"]
    has_length = False
    for name, value in request.headers.raw:
        lowered = name.lower()
        if lowered == b"transfer-encoding":
            continue  # the body is sent whole, with its length
        has_length |= lowered == b"content-length"
        lines.append(name + b": " + value)
    if not has_length and (length or request.method not in ("GET", "HEAD", "DELETE")):
        lines.append(b"Content-Length: " + str(length).encode("ascii"))
    return b"\r\n".join(lines) + b"\r\n\r\n"
