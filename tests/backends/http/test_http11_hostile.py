"""kvgov's HTTP/1.1 client against a hostile engine: a stub server on 127.0.0.1
(``http11_server.py``; a real engine never answers like this, so a stub must) that floods
headers, a status reason, a body or a stream line, answers twice, sends a line that is
not UTF-8, a body that is not JSON or a compression bomb. Each attack runs through
``Transport`` (what ``RemoteBackend`` and the external engines' backends send through),
sync and async: the client stops early with a typed error (``BackendUnavailable``, its
cause ``AnswerRefused`` where a bound was passed), the server could not write its whole
flood, the client's memory stays within a few times the bound (``tracemalloc``'s peak,
the stub's own buffers included), and the next call on the same pool is answered.

A flood is ``FLOOD_BYTES`` (32 MiB); the bounds here are the default head (64 KiB) and
1 MiB for bodies and lines, so each attack passes its bound by many MiB and still takes a
fraction of a second.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from backends.http._http11 import AnswerLimits, AnswerRefused, unsized_head
from backends.http._http11_sync import Http11Transport
from backends.http.transport import Retries, Transport
from backends.remote.backend import RemoteBackend
from governor import BackendUnavailable, ConfigError
from tests.backends.http.http11_server import FLOOD_BYTES, Server, served, serving

MiB = 1024 * 1024
LIMITS = AnswerLimits(max_body_bytes=MiB, max_line_bytes=MiB)
# What the client may hold while it refuses an answer: the bound, a read or two and the
# stub's own write buffers (it runs in this process too). Without the bounds a flood is
# read whole: 32 MiB or more.
MAX_PEAK = 6 * MiB

# path -> what the refusal says
REFUSED = {
    "/header-flood": "head (status line and headers)",
    "/reason-flood": "head (status line and headers)",
    "/many-headers": "headers",
    "/body-flood": "body ran past",
    "/bomb": "decodes past",
    "/trailing": "after a complete answer",
}
FLOODS = ("/header-flood", "/reason-flood", "/body-flood")


def _transport(url: str, **options: object) -> Transport:
    return Transport(
        url,
        api_key=options.pop("api_key", None),  # type: ignore[arg-type]
        timeout=httpx.Timeout(10),
        retries=Retries(attempts=3, backoff_s=0.001),
        limits=httpx.Limits(),
        name="hostile",
        answer_limits=LIMITS,
    )


@contextmanager
def _peak() -> Iterator[list[int]]:
    """The peak of Python's allocations in the block, in bytes (``peak[0]`` after it)."""
    peak: list[int] = []
    tracemalloc.start()
    try:
        yield peak
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


def _check_refused(exc: BackendUnavailable, path: str) -> None:
    assert isinstance(exc.__cause__, AnswerRefused), (path, exc.__cause__)
    assert REFUSED[path] in str(exc), (path, str(exc))
    assert exc.backend == "hostile"


def test_sync_answers_past_their_bounds_are_refused_early() -> None:
    with served() as (server, loop):
        transport = _transport(server.url)
        for path in REFUSED:
            with _peak() as peak, pytest.raises(BackendUnavailable) as caught:
                transport.request("GET", path)
            _check_refused(caught.value, path)
            assert peak[0] < MAX_PEAK, (path, peak[0])
            assert _asked(server, path) == 1  # a GET, yet not asked again
            if path in FLOODS:
                asyncio.run_coroutine_threadsafe(_flooded(server), loop).result(10)
                assert server.num_flood_bytes < FLOOD_BYTES, path  # the client hung up
            assert transport.request("GET", "/hello").content == b"hello"
        transport.close()


def test_async_answers_past_their_bounds_are_refused_early() -> None:
    async def main() -> None:
        async with serving() as server:
            transport = _transport(server.url)
            for path in REFUSED:
                with _peak() as peak, pytest.raises(BackendUnavailable) as caught:
                    await transport.arequest("GET", path)
                _check_refused(caught.value, path)
                assert peak[0] < MAX_PEAK, (path, peak[0])
                assert _asked(server, path) == 1
                if path in FLOODS:
                    await _flooded(server)
                    assert server.num_flood_bytes < FLOOD_BYTES, path
                assert (await transport.arequest("GET", "/hello")).content == b"hello"
            await transport.aclose()
            transport.close()

    asyncio.run(main())


def _asked(server: Server, path: str) -> int:
    return sum(head[0].startswith(f"GET {path} ") for head in server.heads)


async def _flooded(server: Server) -> None:
    await asyncio.wait_for(server.flooded.wait(), 10)


def test_a_stream_line_past_its_bound_or_not_utf8_is_refused() -> None:
    """A line that never ends, at once or after short lines in many small reads, stops
    at ``max_line_bytes`` (unbounded, it was joined by ``+=``: quadratic, and read whole);
    a line that is not UTF-8 is ``BackendUnavailable``, not ``UnicodeDecodeError``."""

    async def lines(transport: Transport, path: str) -> list[str]:
        got: list[str] = []
        async with transport.astream(path, json={}) as stream:
            async for line in stream:
                got.append(line)
        return got

    async def main() -> None:
        async with serving() as server:
            transport = _transport(server.url)
            for path, before in (("/line-flood", []), ("/lines-then-flood", ["data: 1", ""])):
                got: list[str] = []
                with _peak() as peak, pytest.raises(BackendUnavailable, match="past 1048576"):
                    async with transport.astream(path, json={}) as stream:
                        async for line in stream:
                            got.append(line)
                assert got == before
                assert peak[0] < MAX_PEAK, (path, peak[0])
                await _flooded(server)
                assert server.num_flood_bytes < FLOOD_BYTES, path
            with pytest.raises(BackendUnavailable, match="not UTF-8"):
                await lines(transport, "/not-utf8")
            assert await lines(transport, "/hello") == ["hello"]
            await transport.aclose()
            transport.close()

    asyncio.run(main())


def test_a_body_that_is_not_json_is_backend_unavailable_sync_and_async() -> None:
    with served() as (server, _):
        transport = _transport(server.url)
        answer = transport.request("GET", "/not-json")
        with pytest.raises(BackendUnavailable, match="not JSON") as caught:
            answer.json()
        assert caught.value.backend == "hostile"

        async def main() -> None:
            answer = await transport.arequest("GET", "/not-json")
            with pytest.raises(BackendUnavailable, match="not JSON"):
                answer.json()
            await transport.aclose()

        asyncio.run(main())
        transport.close()


def test_a_header_value_with_cr_lf_or_nul_is_never_written() -> None:
    """An API key with CR LF would end the head early and write a header (or a whole
    second request) of its own: refused when the backend is made, before any
    connection; and the transport writes no header that holds one."""
    with served() as (server, _):
        for key in ("sk-1\r\nX-Injected: 1", "sk-1\nGET /kvgov/v1/kv HTTP/1.1", "sk\x00"):
            with pytest.raises(ConfigError, match="CR, LF or NUL") as caught:
                _transport(server.url, api_key=key)
            assert caught.value.setting == "api_key"
            with pytest.raises(ConfigError):
                RemoteBackend(server.url, api_key=key)
        assert server.connections == 0 and server.heads == []
        request = httpx.Request("GET", f"{server.url}/hello", headers={"X-Key": "a\r\nb: c"})
        with pytest.raises(httpx.LocalProtocolError, match="CR, LF or NUL"):
            unsized_head(request)
        with (
            httpx.Client(transport=Http11Transport()) as http,
            pytest.raises(httpx.LocalProtocolError),
        ):
            http.send(request)
        assert server.connections == 0


def test_the_bounds_are_checked_when_they_are_set() -> None:
    for field in ("max_head_bytes", "max_headers", "max_body_bytes", "max_line_bytes"):
        with pytest.raises(ValueError, match=field):
            AnswerLimits(**{field: 0})
