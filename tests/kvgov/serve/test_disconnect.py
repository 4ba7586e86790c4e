"""Clients that go away or stop reading, over real sockets against a real uvicorn
server: a disconnect aborts the request and returns its blocks; a client that reads
nothing neither stalls other clients nor keeps the engine from finishing its request."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from governor.local_backend import LocalBackend
from kvgov.serve.background import serving
from kvgov.serve.state import ServerState
from tests.kvgov.serve.api_support import idle_metrics, served_app

LONG = 900  # tokens: seconds of decoding here, far longer than any wait below
MESSAGES = [{"role": "user", "content": "Tell me a long story."}]


@pytest.fixture(scope="module", params=[True, False], ids=["direct", "routed"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, LocalBackend, ServerState]]:
    """The generation routes served by the gateway directly, and through FastAPI's
    router: a disconnect must free everything on either path."""
    with served_app(direct_routes=request.param) as (app, backend), serving(app) as url:
        yield url, backend, app.state.kvgov


def raw_post(url: str, path: str, body: dict[str, object], *, rcvbuf: int = 0) -> socket.socket:
    """An HTTP/1.1 POST written by hand on a plain socket, left open for the caller."""
    parts = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect((parts.hostname, parts.port))
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        piece = sock.recv(4096)
        assert piece, f"the server closed the connection before {marker!r}"
        seen += piece
    return seen


def wait_running(backend: LocalBackend, count: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while backend.metrics().num_requests_running != count:
        assert time.monotonic() < deadline, f"never {count} running request(s)"
        time.sleep(0.01)


def kinds_of(state: ServerState, since: int) -> list[str]:
    return [e.kind for e in state.events.since(since)]


def last_seq(state: ServerState) -> int:
    events = state.events.since(0)
    return events[-1].seq if events else 0


@pytest.mark.parametrize("stream", [True, False])
def test_a_disconnect_aborts_the_request_and_frees_its_blocks(
    server: tuple[str, LocalBackend, ServerState], stream: bool
) -> None:
    url, backend, state = server
    seen = last_seq(state)
    body = {"messages": MESSAGES, "max_tokens": LONG, "stream": stream}
    sock = raw_post(url, "/v1/chat/completions", body)
    if stream:
        read_until(sock, b"data: ")  # mid-stream: tokens are flowing
    wait_running(backend, 1)
    assert backend.metrics().num_blocks_in_use > 0
    started = time.monotonic()
    sock.close()
    metrics = idle_metrics(backend)
    assert metrics.num_blocks_in_use == 0 and metrics.num_requests_running == 0
    # aborted, not finished: the request stopped well before its LONG tokens
    assert kinds_of(state, seen) == ["request.started", "request.aborted"]
    assert time.monotonic() - started < 10


def test_a_client_that_reads_nothing_stalls_nobody(
    server: tuple[str, LocalBackend, ServerState],
) -> None:
    url, backend, _ = server
    body = {"messages": MESSAGES, "max_tokens": 120, "stream": True, "return_token_ids": True}
    slow = raw_post(url, "/v1/chat/completions", body, rcvbuf=1024)  # and never read
    try:
        wait_running(backend, 1)
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(3):
                reply = client.post(
                    "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4}
                )
                assert reply.status_code == 200
                assert reply.json()["usage"]["completion_tokens"] == 4
        # the engine finished the slow client's request without waiting for its reader:
        # nothing runs and no block is held while its answer sits unread
        metrics = idle_metrics(backend, timeout_s=30)
        assert metrics.num_requests_running == 0 and metrics.num_blocks_in_use == 0
    finally:
        slow.close()
    assert idle_metrics(backend).num_blocks_in_use == 0
