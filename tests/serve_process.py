"""``ServerProcess``: a real ``kvgov serve`` in a separate process on a free loopback port,
for tests that need one another process can kill (SIGKILL) and start again on the same
port, or that must not share the test's interpreter (the remote backend's tests).

``with serve_process({"num_blocks": 64}) as server:`` starts uvicorn on
``create_app(LocalBackend(config=...))`` and waits until ``/health`` answers;
``server.kill()`` sends SIGKILL; ``server.start()`` starts a fresh one (a new instance
id) on the same port. Until the app has OpenAI routes of its own, the process mounts
``tests/openai_stand_in.py``'s.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
_START_TIMEOUT_S = 60.0  # importing torch and building the engine on a loaded 2-core box

_SERVER = """
import json, sys
sys.path[:0] = [sys.argv[3]]
import uvicorn
from backends.local.backend import LocalBackend
from kvgov.serve import create_app

backend = LocalBackend(config=json.loads(sys.argv[1]))
app = create_app(backend)
if sys.argv[4] == "standby":  # built, but the port is another's until told to go
    sys.stdin.readline()
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    def __init__(self, config: Mapping[str, Any], port: int | None = None) -> None:
        self.config = dict(config)
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self._next: subprocess.Popen[bytes] | None = None  # a server built, on standby
        # A file, not a pipe: a server that logs much must never block on a full pipe.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server

    def prepare(self) -> None:
        """Start the next server now, up to where it would bind the port: importing torch
        and building the engine take seconds, which ``start`` then saves (a restart
        test's replacement is ready when the killed server is gone)."""
        self._next = self._spawn("standby")

    def start(self, timeout_s: float = _START_TIMEOUT_S) -> str:
        """Start the server and wait for ``/health`` (up to ``timeout_s``: several built
        side by side take longer); returns its instance id."""
        assert self.process is None or self.process.poll() is not None, "already running"
        if self._next is not None:
            self.process, self._next = self._next, None
            assert self.process.stdin is not None
            self.process.stdin.write(b"go\n")
            self.process.stdin.close()
        else:
            self.process = self._spawn("now")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited:\n{self.output()}")
            try:
                answer = httpx.get(f"{self.base_url}/health", timeout=1.0)
                if answer.status_code == 200:
                    return str(answer.json()["instance_id"])
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"the server did not answer /health within {timeout_s} s")

    def _spawn(self, when: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                _SERVER,
                json.dumps(self.config),
                str(self.port),
                str(ROOT),
                when,
            ],
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
            stdin=subprocess.PIPE if when == "standby" else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM killer would: nothing is closed cleanly."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self._next is not None:
            self._next.kill()
            self._next.wait(timeout=10)
            self._next = None
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def output(self) -> str:
        """What the server wrote to stderr so far."""
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")


@contextmanager
def serve_process(config: Mapping[str, Any]) -> Iterator[ServerProcess]:
    server = ServerProcess(config)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        server.log.close()
