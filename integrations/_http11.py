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
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httptools
import httpx

__all__ = ["AsyncHttp11Transport", "Http11Transport"]

_HIGH_WATER = 1 << 20  # bytes buffered unread before the socket stops being read
_READ_SIZE = 1 << 16


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
        key = _key(request, self._closed)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
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


class _Answer:
    """llhttp's callbacks and what they gather: one answer at a time per connection."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self.idle_since = 0.0
        self._headers_done = False
        self._complete = False
        self._error: BaseException | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0

    def _next_answer(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.reason, self.headers = 0, b"", []
        self._headers_done = self._complete = self.keep_alive = False
        self._chunks.clear()
        self._buffered = 0

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise httpx.RemoteProtocolError(f"a malformed answer: {exc}") from None

    def _ended(self) -> None:
        """The connection is gone: an answer with no length ends with it, any other
        that is not whole is cut."""
        if self._headers_done and not self._complete and self._until_close():
            self._complete = True
        elif not self._complete and self._error is None:
            self._error = httpx.RemoteProtocolError("the server closed the connection mid-answer")

    def _headers_read(self, request: httpx.Request) -> None:
        if request.method == "HEAD":  # its answer has headers only, whatever they say
            self._complete = True
            self.keep_alive = self.parser.should_keep_alive()

    def _take(self) -> bytes:
        chunk = self._chunks.popleft()
        while self._chunks:  # what arrived together is read together
            chunk += self._chunks.popleft()
        self._buffered = 0
        return chunk

    @property
    def whole(self) -> bool:
        """The answer was read to its end, without error: the connection may be reused."""
        return self._complete and self._error is None

    def _until_close(self) -> bool:
        names = {name.lower() for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

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


class _Connection(_Answer, asyncio.Protocol):
    """One TCP connection on an event loop: the loop hands it bytes as they arrive."""

    def __init__(self) -> None:
        super().__init__()
        self.transport: asyncio.Transport | None = None
        self._lost = False
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

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
        self._headers_read(request)

    async def read(self, timeout: float | None, request: httpx.Request) -> bytes | None:
        """The next body bytes; None at the end of the answer."""
        while not self._chunks:
            if self._complete:
                return None
            await self._next(timeout, request)
        chunk = self._take()
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

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


class _Hold:
    """An answer's hold on its connection: ended once, it returns the connection to the
    pool when the answer was read whole, and closes it otherwise."""

    def __init__(
        self,
        pool: AsyncHttp11Transport | Http11Transport,
        connection: _Connection | _SyncConnection,
        key: tuple[str, int],
        timeout: float | None,
        request: httpx.Request,
    ) -> None:
        self._pool = pool
        self._connection: Any = connection
        self._key = key
        self._timeout = timeout
        self._request = request

    def _end(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if connection.whole:
            self._pool._checkin(self._key, connection)
        else:
            self._pool._discard(connection)


class _Body(_Hold, httpx.AsyncByteStream):
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


class Http11Transport(httpx.BaseTransport):
    """``AsyncHttp11Transport`` for threads: blocking sockets, each connection used by one
    thread at a time, the pool under a lock. httpcore and h11 spend about 0.3 ms of
    client CPU a call on this host for what a socket read and llhttp do here."""

    def __init__(self, limits: httpx.Limits | None = None) -> None:
        limits = limits or httpx.Limits()
        self._max_connections = limits.max_connections
        self._max_keepalive = limits.max_keepalive_connections
        self._keepalive_expiry = limits.keepalive_expiry
        self._lock = threading.Condition()  # the pool below; never held across I/O
        self._idle: dict[tuple[str, int], list[_SyncConnection]] = {}
        self._open = 0  # connections open or being opened, idle ones included
        self._closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = _key(request, self._closed)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = request.read()
        connection = self._checkout(key, timeouts, request)
        try:
            connection.send(_head(request, len(body)), body, timeouts.get("write"), request)
            connection.wait_headers(timeouts.get("read"), request)
        except BaseException:
            self._discard(connection)
            raise
        return httpx.Response(
            connection.status,
            headers=connection.headers,
            stream=_SyncBody(self, connection, key, timeouts.get("read"), request),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": connection.reason},
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [c for connections in self._idle.values() for c in connections]
            self._idle.clear()
            self._open -= len(idle)
            self._lock.notify_all()
        for connection in idle:
            connection.close()

    def _checkout(
        self, key: tuple[str, int], timeouts: dict[str, float | None], request: httpx.Request
    ) -> _SyncConnection:
        timeout = timeouts.get("pool")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            stale: _SyncConnection | None = None
            with self._lock:
                idle = self._idle.get(key)
                if idle:
                    connection = idle.pop()
                    if connection.reusable(time.monotonic(), self._keepalive_expiry):
                        return connection
                    stale = connection
                elif self._max_connections is None or self._open < self._max_connections:
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
            return _SyncConnection.open(key, timeouts.get("connect"), request)
        except BaseException:
            with self._lock:
                self._open -= 1
                self._lock.notify()
            raise

    def _checkin(self, key: tuple[str, int], connection: _SyncConnection) -> None:
        with self._lock:
            kept = not self._closed and connection.keep_alive
            total = sum(len(connections) for connections in self._idle.values())
            if kept and (self._max_keepalive is None or total < self._max_keepalive):
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


class _SyncConnection(_Answer):
    """One TCP connection read and written by the thread that has it checked out."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock

    @classmethod
    def open(
        cls, key: tuple[str, int], timeout: float | None, request: httpx.Request
    ) -> _SyncConnection:
        try:
            sock = socket.create_connection(key, timeout=timeout)
        except TimeoutError:
            message = f"no connection to {key[0]}:{key[1]} in time"
            raise httpx.ConnectTimeout(message, request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock)

    def reusable(self, now: float, expiry: float | None) -> bool:
        """Fresh, and the server has not closed it (nothing to read on an idle one)."""
        if expiry is not None and now - self.idle_since >= expiry:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable  # an idle connection that reads has been closed (or is broken)

    def send(self, head: bytes, body: bytes, timeout: float | None, request: httpx.Request) -> None:
        self._next_answer()
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(head + body)
        except TimeoutError:
            raise httpx.WriteTimeout("the request was not written in time", request=request) from (
                None
            )
        except OSError as exc:
            raise httpx.WriteError(str(exc), request=request) from exc

    def wait_headers(self, timeout: float | None, request: httpx.Request) -> None:
        while not self._headers_done:
            self._receive(timeout, request)
        self._headers_read(request)

    def read(self, timeout: float | None, request: httpx.Request) -> bytes | None:
        """The next body bytes; None at the end of the answer."""
        while not self._chunks:
            if self._complete:
                return None
            self._receive(timeout, request)
        return self._take()

    def close(self) -> None:
        self.sock.close()

    def _receive(self, timeout: float | None, request: httpx.Request) -> None:
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


class _SyncBody(_Hold, httpx.SyncByteStream):
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


def _key(request: httpx.Request, closed: bool) -> tuple[str, int]:
    url = request.url
    if url.scheme != "http":
        raise httpx.UnsupportedProtocol(
            f"kvgov's HTTP/1.1 transport speaks plain HTTP only, not {url.scheme!r}; "
            "use httpx's own transport for it"
        )
    if closed:
        raise httpx.ConnectError("the transport is closed", request=request)
    return url.host, url.port or 80


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
