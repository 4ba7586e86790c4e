"""Clients that go away or stop reading, over real sockets against a real uvicorn
server: a disconnect aborts the request and returns its blocks; a client that reads
nothing neither stalls other clients nor keeps the engine from finishing its request.

The server's connections have small send buffers (``SO_SNDBUF`` locked at 4 KiB, which
the kernel doubles; unlocked, it grows one to megabytes on loopback, and a whole answer
would fit) and, for the client that reads nothing, a 1 KiB high-water mark on its
transport (asyncio's is 64 KiB): an answer of a few hundred tokens then outgrows every
buffer between the engine and that client, and the test measures each of them.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import socket
import struct
import termios
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn

from backends.local.backend import LocalBackend
from kvgov.serve.background import running_server
from kvgov.serve.state import ServerState
from tests.kvgov.serve.api_support import idle_metrics, routed_requests, served_app

LONG = 900  # tokens: seconds of decoding here, far longer than any wait below
MESSAGES = [{"role": "user", "content": "Tell me a long story."}]
CHAT = "/v1/chat/completions"
SNDBUF = 4096  # asked of the kernel for every connection (it books twice that)
HIGH_WATER = 1024  # bytes a stalled connection's transport holds before it pauses writing
# tokens: about 35 of them, a frame each, fill those buffers; the engine makes the rest
# while the write is paused
UNREAD = 240


@dataclass(frozen=True, slots=True)
class Server:
    url: str
    backend: LocalBackend
    state: ServerState
    uvicorn: uvicorn.Server
    direct: bool
    routed: list[tuple[str, str]]  # (method, path) of each request the app's router ran

    def took_its_path(self, num_routed: int, num_calls: int) -> None:
        """The model calls since the router had run ``num_routed`` requests went the
        app's way: past the router on the direct app, through it on the routed one."""
        calls = [("POST", CHAT)] * num_calls
        assert self.routed[num_routed:] == ([] if self.direct else calls)


@pytest.fixture(scope="module", params=[True, False], ids=["direct", "routed"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """The generation routes served by the gateway directly, and through FastAPI's
    router: a disconnect must free everything on either path."""
    small = [(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)]
    with (
        served_app(direct_routes=request.param) as (app, backend),
        running_server(app, socket_options=small) as (url, served),
    ):
        routed = routed_requests(app)
        yield Server(url, backend, app.state.kvgov, served, request.param, routed)


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
def test_a_disconnect_aborts_the_request_and_frees_its_blocks(server: Server, stream: bool) -> None:
    url, backend, state = server.url, server.backend, server.state
    seen, num_routed = last_seq(state), len(server.routed)
    body = {"messages": MESSAGES, "max_tokens": LONG, "stream": stream}
    sock = raw_post(url, CHAT, body)
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
    server.took_its_path(num_routed, 1)


def test_a_client_that_reads_nothing_stalls_nobody(server: Server) -> None:
    """The engine finishes the request of a client that reads nothing, and returns its
    blocks, while the server's write to that client is paused and other clients are
    answered; the unread answer is larger than every buffer on its way. What the engine
    made and the client has not taken waits in the server, as the engine's outputs
    (``LocalBackend.astream``'s queue): a call's own tokens at most, no KV."""
    url, backend = server.url, server.backend
    num_routed = len(server.routed)
    # seeded: the random model never samples its EOS on this seed, so the answer has all
    # UNREAD tokens (unseeded, one run in many ends early on EOS: a short answer, not a fault)
    body = {
        "messages": MESSAGES,
        "max_tokens": UNREAD,
        "stream": True,
        "return_token_ids": True,
        "seed": 0,
    }
    slow = raw_post(url, CHAT, body, rcvbuf=1024)  # and nothing read until the end
    try:
        connection = connection_of(server.uvicorn, slow)
        loop = server.uvicorn.servers[0].get_loop()
        loop.call_soon_threadsafe(lambda: connection.transport.set_write_buffer_limits(HIGH_WATER))
        wait_for(lambda: connection.flow.write_paused, "the write to the client never paused")
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(3):
                reply = client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 4})
                assert reply.status_code == 200
                assert reply.json()["usage"]["completion_tokens"] == 4
        # the engine finished the slow client's request without waiting for its reader:
        # nothing runs and no block is held while its answer sits unread
        metrics = idle_metrics(backend, timeout_s=30)
        assert metrics.num_requests_running == 0 and metrics.num_requests_waiting == 0
        assert metrics.num_blocks_in_use == 0
        assert connection.flow.write_paused  # still: the client has read nothing
        held = held_bytes(slow, connection.transport)
        answer = read_until(slow, b"data: [DONE]")
    finally:
        slow.close()
    # every buffer between the server's writes and the client's reads is full, and the
    # answer is more than all of them hold: the rest waited in the server, not the engine
    assert len(answer) > sum(held.values()) > HIGH_WATER, held
    frames = [json.loads(line[6:]) for line in answer.split(b"\r\n") if line[:7] == b"data: {"]
    finish = frames[-1]["choices"][0]["kvgov_finish_reason"]
    assert finish == "length", finish  # finished at its limit: not aborted, not stopped
    assert sum(len(f["choices"][0]["token_ids"]) for f in frames) == UNREAD  # all of it
    assert idle_metrics(backend).num_blocks_in_use == 0
    server.took_its_path(num_routed, 4)


def held_bytes(client: socket.socket, transport: asyncio.Transport) -> dict[str, int]:
    """What each buffer holds of the answer, in the answer's own bytes (the kernel books
    ``SO_RCVBUF`` and ``SO_SNDBUF`` in its own, a packet's bookkeeping included, so their
    sizes say little of how much of an answer fits): unread on the client, unsent on the
    server, and in the transport, past its high-water mark as the write paused."""
    server = transport.get_extra_info("socket")

    def queued(fd: int, request: int) -> int:
        count: int = struct.unpack("i", fcntl.ioctl(fd, request, struct.pack("i", 0)))[0]
        return count

    held = {
        "client, unread (FIONREAD)": queued(client.fileno(), termios.FIONREAD),
        "server, unsent (TIOCOUTQ)": queued(server.fileno(), termios.TIOCOUTQ),
        "transport": transport.get_write_buffer_size(),
    }
    assert held["transport"] > transport.get_write_buffer_limits()[1]  # why it paused
    kernel = {
        "client SO_RCVBUF": client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
        "server SO_SNDBUF": server.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
    }
    assert kernel["server SO_SNDBUF"] <= 2 * SNDBUF, kernel  # locked: not grown by the kernel
    return held


def connection_of(served: uvicorn.Server, sock: socket.socket) -> Any:
    """The server's end of ``sock`` (uvicorn's protocol: its ``transport`` and ``flow``)."""
    name = sock.getsockname()
    found: list[Any] = []

    def find() -> bool:
        found[:] = [c for c in list(served.server_state.connections) if c.client == name]
        return bool(found)

    wait_for(find, "the server never took the connection")
    return found[0]


def wait_for(condition: Callable[[], bool], failure: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.01)
