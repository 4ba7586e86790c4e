"""A real redis-server (Debian's package), started by a test on a free loopback port.

Outside CI a missing redis-server skips the test, saying how to install it; under CI
(``CI`` set) the test fails, since ``.ci/run`` installs the package. ``RedisServer`` can
be stopped and started again on the same port, with its data (``save=True``: an RDB
snapshot written on shutdown and read on start) or without, for the store-fault tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

__all__ = ["RedisServer", "need_redis_server"]

SKIP_REASON = (
    "redis-server is not installed (Debian: apt-get install redis-server); the RedisStore "
    "tests run against a real one"
)


def need_redis_server() -> str:
    found = shutil.which("redis-server")
    if found is not None:
        return found
    if os.environ.get("CI"):
        pytest.fail(SKIP_REASON + "; .ci/run installs it, so CI must have it", pytrace=False)
    pytest.skip(SKIP_REASON)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    def __init__(self, workdir: Path, *, save: bool = False) -> None:
        self.binary = need_redis_server()
        self.workdir = workdir
        self.save = save
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        assert self.process is None, "already running"
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--save",
            "3600 1" if self.save else "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
        if not self.save:
            (self.workdir / "dump.rdb").unlink(missing_ok=True)
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"redis-server exited: {err}")
            assert time.monotonic() < deadline, "redis-server never answered PING"
            time.sleep(0.02)

    def stop(self) -> None:
        """Shut down: with ``save``, it writes its data first (SHUTDOWN SAVE)."""
        if self.process is None:
            return
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
            sock.sendall(b"SHUTDOWN SAVE\r\n" if self.save else b"SHUTDOWN NOSAVE\r\n")
            with contextlib.suppress(OSError):
                sock.recv(16)  # the connection closes as the server exits
        self._ended()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self._ended()

    def _ended(self) -> None:
        assert self.process is not None
        self.process.wait(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None
