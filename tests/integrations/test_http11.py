"""``AsyncHttp11Transport`` under httpx's ``AsyncClient``, against a real asyncio server on
127.0.0.1 that answers each path its own way: lengths, chunks, until-close bodies,
keep-alive, malformed and cut answers, slow answers, and a client that stops reading.
(``RemoteBackend``'s async calls and streams run on it against ``kvgov serve`` throughout
the suite; these are the cases that server never produces.)"""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from integrations._http11_async import AsyncHttp11Transport
from integrations._http11_sync import Http11Transport

Writer = asyncio.StreamWriter


@dataclass
class Server:
    url: str
    connections: int = 0
    closed_by_client: int = 0
    bodies: list[bytes] = field(default_factory=list)
    heads: list[list[str]] = field(default_factory=list)  # each request's header lines
    release: asyncio.Event = field(default_factory=asyncio.Event)


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


def client(server: Server, **options: object) -> httpx.AsyncClient:
    limits = options.pop("limits", httpx.Limits())
    transport = AsyncHttp11Transport(limits)  # type: ignore[arg-type]
    return httpx.AsyncClient(base_url=server.url, transport=transport, **options)  # type: ignore[arg-type]


def test_answers_with_a_length_reuse_the_connection_and_bodies_go_whole() -> None:
    async def main() -> None:
        async with serving() as server, client(server) as http:
            for _ in range(3):
                assert (await http.get("/hello")).content == b"hello"
            payload = b"x" * 200_000  # over one write: sent whole, with its length
            answer = await http.post("/echo", content=payload)
            assert answer.content == payload
            assert answer.http_version == "HTTP/1.1"
            assert server.connections == 1  # kept alive throughout

    asyncio.run(main())


def test_a_chunked_answer_arrives_as_it_is_sent() -> None:
    async def main() -> None:
        async with serving() as server, client(server) as http:
            async with http.stream("GET", "/chunks") as answer:
                chunks = answer.aiter_bytes()
                assert await anext(chunks) == b"first"  # before the second is written
                server.release.set()
                assert [c async for c in chunks] == [b"second"]
            assert (await http.get("/hello")).content == b"hello"
            assert server.connections == 1

    asyncio.run(main())


def test_an_answer_without_a_length_ends_with_the_connection() -> None:
    async def main() -> None:
        async with serving() as server, client(server) as http:
            assert (await http.get("/until-close")).content == b"all of it"
            assert (await http.get("/close-after")).content == b"once"
            assert (await http.get("/hello")).content == b"hello"
            assert server.connections == 3  # none of the closed ones reused
            assert (await http.get("/idle-close")).content == b"bye"
            await asyncio.sleep(0.2)  # closed by the server while idle in the pool
            assert (await http.get("/hello")).content == b"hello"
            assert server.connections == 4

    asyncio.run(main())


def test_broken_answers_are_remote_protocol_errors_and_the_pool_recovers() -> None:
    async def main() -> None:
        async with serving() as server, client(server) as http:
            with pytest.raises(httpx.RemoteProtocolError, match="malformed"):
                await http.get("/malformed")
            with pytest.raises(httpx.RemoteProtocolError, match="mid-answer"):
                await http.get("/cut")
            assert (await http.get("/hello")).content == b"hello"

    asyncio.run(main())


def test_timeouts_and_refused_connections_are_httpx_errors() -> None:
    async def main() -> None:
        async with serving() as server:
            async with client(server, timeout=httpx.Timeout(5, read=0.05)) as http:
                with pytest.raises(httpx.ReadTimeout):
                    await http.get("/slow")
                server.release.set()
                assert (await http.get("/hello")).content == b"hello"  # a new connection
            url = server.url
        async with httpx.AsyncClient(transport=AsyncHttp11Transport()) as http:
            with pytest.raises(httpx.ConnectError):
                await http.get(f"{url}/hello")  # the server is gone
            with pytest.raises(httpx.UnsupportedProtocol):
                await http.get("https://127.0.0.1:1/hello")

    asyncio.run(main())


def test_a_reader_that_stops_early_closes_the_connection() -> None:
    """The server sees the client leave (as kvgov serve must, to abort the call), and the
    connection is never handed to the next request."""

    async def main() -> None:
        async with serving() as server, client(server) as http:
            async with http.stream("GET", "/endless") as answer:
                async for chunk in answer.aiter_bytes():
                    assert b"tick" in chunk
                    break
            for _ in range(200):
                if server.closed_by_client:
                    break
                await asyncio.sleep(0.01)
            assert server.closed_by_client == 1
            assert (await http.get("/hello")).content == b"hello"
            assert server.connections == 2

    asyncio.run(main())


def test_a_cancelled_read_closes_the_connection() -> None:
    async def main() -> None:
        async with serving() as server, client(server) as http:
            task = asyncio.ensure_future(http.get("/slow"))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            server.release.set()
            assert (await http.get("/hello")).content == b"hello"
            assert server.connections == 2  # the cancelled one's connection was not reused

    asyncio.run(main())


def test_the_pool_limit_holds_and_a_freed_connection_goes_to_the_waiter() -> None:
    async def main() -> None:
        limits = httpx.Limits(max_connections=1)
        async with serving() as server:
            timeout = httpx.Timeout(5, pool=0.05)
            async with client(server, limits=limits, timeout=timeout) as http:
                async with http.stream("GET", "/chunks") as answer:
                    chunks = answer.aiter_bytes()
                    await anext(chunks)
                    with pytest.raises(httpx.PoolTimeout):
                        await http.get("/hello")  # the only connection is in use
                    waiting = asyncio.ensure_future(http.get("/hello", timeout=httpx.Timeout(5)))
                    await asyncio.sleep(0.02)
                    assert not waiting.done()
                    server.release.set()
                    assert [c async for c in chunks] == [b"second"]
                assert (await waiting).content == b"hello"
            assert server.connections <= 2

    asyncio.run(main())


# -- the sync transport, from threads, against the same server on a loop of its own ------
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


def _release(server: Server, loop: asyncio.AbstractEventLoop) -> None:
    loop.call_soon_threadsafe(server.release.set)


def test_sync_answers_chunks_and_keep_alive() -> None:
    with served() as (server, loop), sync_client(server) as http:
        for _ in range(3):
            assert http.get("/hello").content == b"hello"
        payload = b"y" * 200_000
        assert http.post("/echo", content=payload).content == payload
        with http.stream("GET", "/chunks") as answer:
            chunks = answer.iter_bytes()
            assert next(chunks) == b"first"  # before the second is written
            _release(server, loop)
            assert list(chunks) == [b"second"]
        assert server.connections == 1
        assert http.get("/until-close").content == b"all of it"
        assert http.get("/idle-close").content == b"bye"
        time.sleep(0.2)  # closed by the server while idle in the pool: not reused
        assert http.get("/hello").content == b"hello"
        assert server.connections == 3


def test_sync_errors_are_httpx_errors_and_the_pool_recovers() -> None:
    with served() as (server, loop):
        with sync_client(server, timeout=httpx.Timeout(5, read=0.05)) as http:
            with pytest.raises(httpx.RemoteProtocolError, match="malformed"):
                http.get("/malformed")
            with pytest.raises(httpx.RemoteProtocolError, match="mid-answer"):
                http.get("/cut")
            with pytest.raises(httpx.ReadTimeout):
                http.get("/slow")
            _release(server, loop)
            assert http.get("/hello").content == b"hello"
        url = server.url
    with httpx.Client(transport=Http11Transport()) as http:
        with pytest.raises(httpx.ConnectError):
            http.get(f"{url}/hello")
        with pytest.raises(httpx.UnsupportedProtocol):
            http.get("https://127.0.0.1:1/hello")


def test_sync_a_reader_that_stops_early_closes_the_connection() -> None:
    with served() as (server, _loop), sync_client(server) as http:
        with http.stream("GET", "/endless") as answer:
            for chunk in answer.iter_bytes():
                assert b"tick" in chunk
                break
        deadline = time.monotonic() + 5
        while not server.closed_by_client and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.closed_by_client == 1
        assert http.get("/hello").content == b"hello"
        assert server.connections == 2


def test_sync_the_pool_limit_holds_across_threads() -> None:
    limits = httpx.Limits(max_connections=1)
    with served() as (server, loop):
        timeout = httpx.Timeout(5, pool=0.05)
        with sync_client(server, limits=limits, timeout=timeout) as http:
            with http.stream("GET", "/chunks") as answer:
                chunks = answer.iter_bytes()
                next(chunks)
                with pytest.raises(httpx.PoolTimeout):
                    http.get("/hello")
                got: list[bytes] = []
                waiting = threading.Thread(
                    target=lambda: got.append(http.get("/hello", timeout=5).content)
                )
                waiting.start()
                time.sleep(0.05)
                assert not got
                _release(server, loop)
                assert list(chunks) == [b"second"]
            waiting.join(5)
            assert got == [b"hello"]
        assert server.connections == 1  # the waiter took the freed connection


def test_sync_whole_exchanges_answer_as_a_read_response_and_write_as_httpx() -> None:
    """``exchange``: a request written whole, its answer read whole (what RemoteBackend's
    calls that are not streamed use), against every kind of answer the client reads."""
    from integrations._http11 import Reply
    from integrations._remote_http import Retries, Transport

    with served() as (server, loop):
        lean = Transport(
            server.url,
            api_key="sk-x",
            timeout=httpx.Timeout(5, read=0.05),
            retries=Retries(attempts=1),
            limits=httpx.Limits(),
            name="test",
        )
        exchange = lean._direct
        assert exchange is not None
        timeouts = lean._timeouts

        def call(method: str, path: str, json: object = None) -> httpx.Response | Reply:
            url = lean.url(path)
            return exchange.exchange(method, url, lean._written(method, path, json), timeouts)

        for _ in range(3):
            assert call("GET", "/hello").content == b"hello"
        payload = {"text": "ü" * 100_000, "n": [1, 2.5, None, True]}
        echoed = call("POST", "/echo", payload)
        assert echoed.content == httpx.Request("POST", "http://x", json=payload).read()
        assert echoed.json() == payload and echoed.status_code == 200
        # a plain answer is a Reply: httpx's headers on demand, one header read without them
        assert isinstance(echoed, Reply)
        assert (
            echoed.header("CONTENT-length")
            == echoed.headers["content-length"]
            == str(len(echoed.content))
        )
        assert echoed.header("x-absent") is None and echoed.headers.get("x-absent") is None
        assert server.connections == 1  # kept alive and reused
        # the head of the same request built by httpx and written by handle_request
        answer = exchange.handle_request(lean._request("POST", "/echo", payload))
        answer.read()
        answer.close()
        assert sorted(server.heads[-2]) == sorted(server.heads[-1])
        assert call("POST", "/echo").content == b""  # a POST without a body: length 0
        assert server.heads[-1][-1] == "Content-Length: 0"
        assert call("GET", "/hello").text == "hello"
        for content_type in ("text/plain; charset=latin-1", "text/plain", "x; charset=nope"):
            body = "é ü".encode("latin-1")
            headers = [(b"content-type", content_type.encode())]
            theirs = httpx.Response(200, headers=headers, content=body)
            assert Reply(200, headers, body).text == theirs.text, content_type
        _release(server, loop)
        assert call("GET", "/chunks").content == b"firstsecond"
        zipped = call("GET", "/gzip")  # an encoded body: httpx's response, decoded as it does
        assert isinstance(zipped, httpx.Response) and zipped.content == b"unzipped"
        assert call("GET", "/until-close").content == b"all of it"
        with pytest.raises(httpx.RemoteProtocolError, match="malformed"):
            call("GET", "/malformed")
        with pytest.raises(httpx.RemoteProtocolError, match="mid-answer"):
            call("GET", "/cut")
        server.release.clear()
        with pytest.raises(httpx.ReadTimeout):
            call("GET", "/slow")
        _release(server, loop)
        assert call("GET", "/hello").content == b"hello"  # the pool recovered
        lean.close()


# -- where RemoteBackend uses it ----------------------------------------------------------
def test_the_lean_transport_serves_plain_http_and_leaves_proxies_and_https_to_httpx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from integrations._remote_http import Retries, Transport

    def transport(url: str) -> Transport:
        return Transport(
            url,
            api_key=None,
            timeout=httpx.Timeout(5),
            retries=Retries(),
            limits=httpx.Limits(),
            name="test",
        )

    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(transport("http://127.0.0.1:8000")._direct, Http11Transport)
    assert transport("https://gpu-box:8000")._direct is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    assert transport("http://gpu-box:8000")._direct is None  # httpx's client proxies it
    monkeypatch.setenv("NO_PROXY", "gpu-box")
    assert isinstance(transport("http://gpu-box:8000")._direct, Http11Transport)
