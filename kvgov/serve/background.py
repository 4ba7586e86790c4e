"""``serving(app)``: an ASGI app under a real uvicorn server on a free loopback port, in a
background thread, for as long as a ``with`` block lasts; ``running_server(app)`` the
same, with the ``uvicorn.Server`` too (its connections, for a test that looks at how a
connection's writes stand).

For the live page's screenshot script and for tests that drive the server over real
sockets (a browser, an HTTP client). The socket is bound before the thread starts, so the
address is known at once and no other process can take the port in between.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:
    from starlette.types import ASGIApp

__all__ = ["running_server", "serving"]

_START_TIMEOUT_S = 30.0


@contextmanager
def serving(
    app: ASGIApp,
    *,
    host: str = "127.0.0.1",
    config: Callable[..., uvicorn.Config] | None = None,
) -> Iterator[str]:
    """Yields the base URL (``http://127.0.0.1:PORT``); stops the server on exit.
    ``config(app, host=, port=)`` makes uvicorn's settings (``kvgov.cli.serve.uvicorn_config``
    to serve as ``kvgov serve`` does); by default quiet, with no access log."""
    with running_server(app, host=host, config=config) as (url, _server):
        yield url


@contextmanager
def running_server(
    app: ASGIApp,
    *,
    host: str = "127.0.0.1",
    config: Callable[..., uvicorn.Config] | None = None,
    socket_options: Sequence[tuple[int, int, int]] = (),
) -> Iterator[tuple[str, uvicorn.Server]]:
    """``serving``'s URL and the server. ``socket_options`` (``(level, name, value)``)
    are set on the listening socket, which the connections it accepts inherit on Linux
    (a small locked ``SO_SNDBUF``: the kernel no longer grows it to megabytes)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for level, name, value in socket_options:
        sock.setsockopt(level, name, value)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    if config is None:
        settings = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            ws="none",
            lifespan="on",
            timeout_graceful_shutdown=5,
        )
    else:
        settings = config(app, host=host, port=port)
    server = uvicorn.Server(settings)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"uvicorn did not start on {host}:{port} in {_START_TIMEOUT_S} s")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=_START_TIMEOUT_S)
        sock.close()
        if thread.is_alive():
            raise RuntimeError(f"uvicorn on {host}:{port} did not stop in {_START_TIMEOUT_S} s")
