"""The HTTP/1.1 server the transport tests talk to, and the clients pointed at it.

``serving()`` runs a real asyncio server on 127.0.0.1 that answers each path its own way:
lengths, chunks, until-close bodies, keep-alive, malformed and cut answers, slow answers,
and an endless stream for a client that stops reading. ``served()`` runs the same server
on an event loop of its own thread, for the sync transport. Shared by ``test_http11.py``
(``AsyncHttp11Transport``) and ``test_http11_sync.py`` (``Http11Transport``).

It is also a hostile engine (``test_http11_hostile.py``): floods of headers, of a status
reason, of a body or of one stream line (``FLOOD_BYTES`` each, written until the client
closes; ``Server.num_flood_bytes`` says how far it got), a second answer after a
complete one, a line that is not UTF-8, a body that is not JSON and a gzip bomb.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

import httpx

from backends.http._http11_async import AsyncHttp11Transport
from backends.http._http11_sync import Http11Transport

Writer = asyncio.StreamWriter


@dataclass
class Server:
    url: str
    connections: int = 0
    closed_by_client: int = 0
    bodies: list[bytes] = field(default_factory=list)
    heads: list[list[str]] = field(default_factory=list)  # each request's header lines
    release: asyncio.Event = field(default_factory=asyncio.Event)
    num_flood_bytes: int = 0  # what the last flood wrote before the client closed
    flooded: asyncio.Event = field(default_factory=asyncio.Event)  # it has stopped
    handlers: set[asyncio.Task[None]] = field(default_factory=set)  # ended with the server


async def _read_request(
    reader: asyncio.StreamReader,
) -> tuple[str, list[str], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode().split("\r\n")
    path = lines[0].split(" ")[1]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return path, [line for line in lines if line], await reader.readexactly(length)


def _answer(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _handle(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
    server.connections += 1
    task = asyncio.current_task()
    assert task is not None
    server.handlers.add(task)
    try:
        while (request := await _read_request(reader)) is not None:
            path, head, body = request
            server.heads.append(head)
            server.bodies.append(body)
            if not await _ROUTES[path](server, writer, reader):
                break
    finally:
        writer.close()


async def _hello(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    writer.write(_answer(b"hello"))
    return True


async def _echo(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    writer.write(_answer(server.bodies[-1]))
    return True


async def _chunks(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    """Two chunks; the second only once the test has read the first."""
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
    await writer.drain()
    await server.release.wait()
    writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
    return True


async def _idle_close(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    """Answers, keeps the connection alive, then closes it while it is idle (as uvicorn
    does after its keep-alive timeout)."""
    writer.write(_answer(b"bye"))
    await writer.drain()
    await asyncio.sleep(0.05)
    return False


async def _gzipped(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    writer.write(_answer(gzip.compress(b"unzipped"), "Content-Encoding: gzip"))
    return True


async def _until_close(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
    return False


async def _close_after(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    writer.write(_answer(b"once", "Connection: close"))
    return False


async def _malformed(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    writer.write(b"HTTP/1.1 abc nonsense\r\n\r\n")
    return False


async def _cut(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
    return False


async def _slow(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    await server.release.wait()
    writer.write(_answer(b"late"))
    return True


async def _endless(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    """Chunks until the client goes away (it stops reading and closes)."""
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    try:
        while True:
            writer.write(b"4\r\ntick\r\n")
            await writer.drain()
            if await _closed(reader):
                server.closed_by_client += 1
                return False
    except ConnectionError:
        server.closed_by_client += 1
        return False


async def _closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 0.01) == b""
    except asyncio.TimeoutError:
        return False


# -- a hostile engine ---------------------------------------------------------------------
FLOOD_BYTES = 32 * 1024 * 1024  # a flood's size: far past every bound the client sets


async def _flood(server: Server, writer: Writer, head: bytes, unit: bytes) -> bool:
    """``head``, then ``unit`` over and over up to ``FLOOD_BYTES``, until the client closes."""
    server.num_flood_bytes = 0
    server.flooded.clear()
    try:
        writer.write(head)
        while server.num_flood_bytes < FLOOD_BYTES:
            writer.write(unit)
            server.num_flood_bytes += len(unit)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        server.flooded.set()
    return False


async def _header_flood(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    """One header whose value never ends (the many-headers case is ``_many_headers``)."""
    return await _flood(server, writer, b"HTTP/1.1 200 OK\r\nX-Flood: ", b"a" * 65_536)


async def _reason_flood(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    return await _flood(server, writer, b"HTTP/1.1 200 ", b"A" * 65_536)


async def _many_headers(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    headers = b"".join(b"X-H%d: 1\r\n" % i for i in range(1_000))  # 12 KB: under the size
    writer.write(b"HTTP/1.1 200 OK\r\n" + headers + b"Content-Length: 2\r\n\r\nok")
    return True


async def _body_flood(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % FLOOD_BYTES
    return await _flood(server, writer, head, b"0" * 65_536)


async def _line_flood(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    """A stream whose first line never ends."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: "
    return await _flood(server, writer, head, b"x" * 65_536)


async def _lines_then_flood(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    """A stream of short lines, then one that never ends, in many small reads."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\ndata: "
    return await _flood(server, writer, head, b"y" * 1_000)


async def _trailing(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    """A complete answer, then a second one nobody asked for, in one write."""
    writer.write(_answer(b"hello") + _answer(b"bad"))
    await writer.drain()
    await asyncio.sleep(0.05)  # kept open: the client, not the server, ends it
    return False


async def _not_utf8(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    writer.write(_answer(b'data: {"a": 1}\n\ndata: \xff\xfe\xfd\n\n'))
    return True


async def _not_json(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    writer.write(_answer(b"<html>an error page</html>"))
    return True


_BOMB = zlib.compress(b"\0" * FLOOD_BYTES)  # 32 KiB that decode to FLOOD_BYTES


async def _gzip_bomb(server: Server, writer: Writer, reader: asyncio.StreamReader) -> bool:
    writer.write(_answer(_BOMB, "Content-Encoding: deflate"))
    return True


_ROUTES: dict[str, Callable[[Server, Writer, asyncio.StreamReader], Awaitable[bool]]] = {
    "/hello": _hello,
    "/echo": _echo,
    "/chunks": _chunks,
    "/gzip": _gzipped,
    "/until-close": _until_close,
    "/idle-close": _idle_close,
    "/close-after": _close_after,
    "/malformed": _malformed,
    "/cut": _cut,
    "/slow": _slow,
    "/endless": _endless,
    "/header-flood": _header_flood,
    "/reason-flood": _reason_flood,
    "/many-headers": _many_headers,
    "/body-flood": _body_flood,
    "/line-flood": _line_flood,
    "/lines-then-flood": _lines_then_flood,
    "/trailing": _trailing,
    "/not-utf8": _not_utf8,
    "/not-json": _not_json,
    "/bomb": _gzip_bomb,
}


@asynccontextmanager
async def serving() -> AsyncIterator[Server]:
    state = Server(url="")
    server = await asyncio.start_server(lambda r, w: _handle(state, r, w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        server.close()
        # Connections still open (a flood's, a kept-alive one's) end here, on a live loop.
        for handler in state.handlers:
            handler.cancel()
        await asyncio.gather(*state.handlers, return_exceptions=True)


def client(server: Server, **options: object) -> httpx.AsyncClient:
    limits = options.pop("limits", httpx.Limits())
    transport = AsyncHttp11Transport(limits)  # type: ignore[arg-type]
    return httpx.AsyncClient(base_url=server.url, transport=transport, **options)  # type: ignore[arg-type]


# -- the same server on a loop of its own, for the sync transport from threads -----------
@contextmanager
def served() -> Iterator[tuple[Server, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    opened = serving()
    server = asyncio.run_coroutine_threadsafe(opened.__aenter__(), loop).result(5)
    try:
        yield server, loop
    finally:
        asyncio.run_coroutine_threadsafe(opened.__aexit__(None, None, None), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def sync_client(server: Server, **options: object) -> httpx.Client:
    limits = options.pop("limits", httpx.Limits())
    transport = Http11Transport(limits)  # type: ignore[arg-type]
    return httpx.Client(base_url=server.url, transport=transport, **options)  # type: ignore[arg-type]
