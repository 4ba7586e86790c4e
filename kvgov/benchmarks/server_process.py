"""``ServerProcess``: ``python -m kvgov.serve`` in a child process on a free loopback port,
for a benchmark that must not share its interpreter (or its GIL) with the server
(``serve_child.ServeChild`` runs another command under the same lifecycle).

``with ServerProcess(model=..., num_blocks=..., threads=...) as server:`` starts the
server (``spawn``) and yields at once, so the caller builds what it needs meanwhile;
``server.wait_ready()`` waits until ``/health`` answers 200 (``start`` does both).
Leaving the block (normally, on an error or on ``KeyboardInterrupt``) terminates the
server, kills it if it lingers, and waits for it, so no server outlives the benchmark.
The child imports the same ``kvgov`` as this process (its folder goes first on
``PYTHONPATH``) and runs torch with ``threads`` intra-op threads (``OMP_NUM_THREADS``,
which torch reads at start), as ``torch.set_num_threads`` sets them here. Its log goes
to a temporary file, never a pipe that could fill and block it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx
from typing_extensions import Self

__all__ = ["ServerProcess", "ServerStartError"]

_START_TIMEOUT_S = 120.0  # importing torch and building the engine on a loaded 2-core box
_STOP_TIMEOUT_S = 10.0
_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the kvgov package


class ServerStartError(RuntimeError):
    """The server exited or did not answer ``/health`` in time; the message has its log."""


class ServerProcess:
    def __init__(self, *, model: str, num_blocks: int, threads: int, device: str = "cpu") -> None:
        self.model = model
        self.num_blocks = num_blocks
        self.threads = threads
        self.device = device
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self) -> None:
        """Start the server and wait until it answers ``/health``."""
        self.spawn()
        self.wait_ready()

    def command(self) -> list[str]:
        flags = {
            "--model": self.model,
            "--port": str(self.port),
            "--num-blocks": str(self.num_blocks),
            "--device": self.device,
        }
        return [
            sys.executable,
            "-m",
            "kvgov.serve",
            *(part for flag in flags.items() for part in flag),
        ]

    def spawn(self) -> None:
        """Start the server without waiting for it (``wait_ready`` waits): what the caller
        builds meanwhile overlaps the server's seconds of importing torch."""
        self.spawn_with()

    def spawn_with(self, *, pass_fds: tuple[int, ...] = ()) -> None:
        threads = str(self.threads)
        path = os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))
        env = {
            **os.environ,
            "PYTHONPATH": path,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "PYTHONWARNINGS": "ignore",
        }
        self.process = subprocess.Popen(
            self.command(),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            pass_fds=pass_fds,
        )

    def wait_ready(self) -> None:
        assert self.process is not None, "spawn() first"
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(f"kvgov serve exited at start:\n{self.output()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise ServerStartError(
            f"kvgov serve did not answer /health within {_START_TIMEOUT_S:g} s:\n{self.output()}"
        )

    def stop(self) -> None:
        """Terminate the server (SIGKILL if it lingers) and wait until it is gone."""
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=_STOP_TIMEOUT_S)
        if not self._log.closed:
            self._log.close()

    def output(self) -> str:
        """What the server printed so far."""
        if self._log.closed:
            return ""
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")

    def __enter__(self) -> Self:
        """Spawns the server; ``wait_ready`` before the first call."""
        try:
            self.spawn()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
