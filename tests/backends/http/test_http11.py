"""``AsyncHttp11Transport`` under httpx's ``AsyncClient``, against a real asyncio server on
127.0.0.1 (``http11_server.py``) that answers each path its own way: lengths, chunks,
until-close bodies, keep-alive, malformed and cut answers, slow answers, and a client that
stops reading. (``RemoteBackend``'s async calls and streams run on it against ``kvgov serve``
throughout the suite; these are the cases that server never produces.) The sync transport's
tests are in ``test_http11_sync.py``."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from backends.http._http11_async import AsyncHttp11Transport
from tests.backends.http.http11_server import client, serving


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
