"""``Http11Transport``, the sync HTTP/1.1 transport, under httpx's ``Client`` from threads,
against the same real server as the async tests (``http11_server.py``) on an event loop of
its own: answers, chunks and keep-alive, errors and a recovered pool, a reader that stops
early, the pool limit across threads, ``exchange``'s whole requests and answers, and where
``RemoteBackend``'s transport uses it and where it leaves the request to httpx."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from backends.http._http11_sync import Http11Transport
from tests.backends.http.http11_server import Server, served, sync_client


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
    from backends.http._http11 import Reply
    from backends.http.transport import Retries, Transport

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
        zipped = call("GET", "/gzip")  # an encoded body: decoded as httpx decodes it
        assert isinstance(zipped, Reply) and zipped.content == b"unzipped"
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
    from backends.http.transport import Retries, Transport

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
