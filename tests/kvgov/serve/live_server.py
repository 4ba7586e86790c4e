"""``live_server(app)``: a real uvicorn server on 127.0.0.1, in this process, on a free port.

The server runs in a thread (``uvicorn.Server.run``; it installs no signal handlers off
the main thread); the context manager yields its base URL once it accepts connections
and, on exit, asks it to stop and waits for the thread. For a server that must be killed
(SIGKILL, restarts), start a separate process instead.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.types import ASGIApp

__all__ = ["live_server"]

_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 30.0


@contextmanager
def live_server(app: ASGIApp) -> Iterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # the kernel picks a free port; uvicorn listens on it
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", ws="none", lifespan="off", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="live-uvicorn", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError(f"uvicorn did not start on 127.0.0.1:{port}")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(_STOP_TIMEOUT_S)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"
