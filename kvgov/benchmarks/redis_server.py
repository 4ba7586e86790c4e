"""The Redis server a benchmark runs against: ``KVGOV_REDIS_URL``'s, or a temporary
``redis-server`` on a free loopback port (no persistence), stopped on the way out."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

from governor import RedisStore
from kvgov.cli.output import fail

__all__ = ["ENV_URL", "RedisAt", "delete_keys", "redis_server"]

ENV_URL = "KVGOV_REDIS_URL"
_STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class RedisAt:
    url: str
    label: str  # what it is, for the notes
    process: subprocess.Popen[bytes] | None  # the temporary server; None for KVGOV_REDIS_URL


@contextmanager
def redis_server() -> Iterator[RedisAt]:
    """``KVGOV_REDIS_URL``'s server, or a temporary ``redis-server`` on a free loopback port
    (no persistence), stopped on the way out."""
    if importlib.util.find_spec("redis") is None:
        fail("kvgov bench processes needs redis-py: pip install 'kvgov[redis]'")
    url = os.environ.get(ENV_URL)
    if url:
        where = RedisStore(url).where
        yield RedisAt(url, f"Redis {_version(url)} at {where} ({ENV_URL})", None)
        return
    binary = shutil.which("redis-server")
    if binary is None:
        fail(
            "kvgov bench processes starts a redis-server, and none is on PATH: install "
            "Redis 7 (Debian and Ubuntu: apt-get install redis-server; macOS: brew install "
            f"redis), or set {ENV_URL}=redis://host:port/db to use a running server"
        )
    port = _free_port()
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryFile() as log:
        args = [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            folder,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        try:
            _wait_for_ping(process, port, log)
            url = f"redis://127.0.0.1:{port}/0"
            label = f"a temporary redis-server {_version(url)} on loopback, no persistence"
            yield RedisAt(url, label, process)
        finally:
            process.terminate()
            try:
                process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=_STOP_TIMEOUT_S)


def _wait_for_ping(process: subprocess.Popen[bytes], port: int, log: IO[bytes]) -> None:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"redis-server exited at start:\n{log.read().decode()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"redis-server did not answer PING on port {port} within 10 s")


def _version(url: str) -> str:
    client = RedisStore(url).client()
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


def delete_keys(url: str, run_id: str) -> tuple[int, int]:
    """Delete the keys of this run's namespaces: how many, and how many are left."""
    client = RedisStore(url).client()
    pattern = f"kvgov:{{{run_id}-*"
    try:
        keys = list(client.scan_iter(match=pattern, count=1_000))
        if keys:
            client.delete(*keys)
        return len(keys), sum(1 for _ in client.scan_iter(match=pattern, count=1_000))
    finally:
        client.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
