"""What the multi-process store tests share: agent processes (tests/store/agent_process.py)
and what they printed, a watch on the engine's own reservations, and reads of the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.local.backend import LocalBackend
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
TTL_S = 1.0
AGENTS = 8


@dataclass
class Process:
    """One agent process and the JSON lines it printed so far (read on a thread)."""

    popen: subprocess.Popen[str]
    lines: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # its stderr's lines
    proc: str = ""

    def start_reading(self) -> None:
        def read() -> None:
            assert self.popen.stdout is not None
            for line in self.popen.stdout:
                record = json.loads(line)
                if "proc" in record:
                    self.proc = record["proc"]
                self.lines.append(record)

        def read_errors() -> None:  # read as it comes: a full pipe would stop the process
            assert self.popen.stderr is not None
            for line in self.popen.stderr:
                self.errors.append(line)

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=read_errors, daemon=True).start()

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("event") == kind]

    def wait_for(self, kind: str, count: int = 1, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.events(kind)) < count:
            assert time.monotonic() < deadline, f"no {count} {kind!r} from {self.lines}"
            assert self.popen.poll() is None or kind == "done", self.stderr()
            time.sleep(0.01)

    def wait_for_proc(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.proc:
            assert time.monotonic() < deadline and self.popen.poll() is None, self.stderr()
            time.sleep(0.01)

    def stderr(self) -> str:
        return "".join(self.errors)

    def end(self) -> None:
        """Killed if still running; its pipes closed."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)
        for pipe in (self.popen.stdout, self.popen.stderr):
            if pipe is not None:
                pipe.close()


@contextmanager
def spawned(count: int, *args: Any, **options: Any) -> Iterator[list[Process]]:
    processes = [spawn(*args, **options) for _ in range(count)]
    try:
        yield processes
    finally:
        for process in processes:
            process.end()


def spawn(serve: str, redis_url: str, namespace: str, ceiling: int, **options: Any) -> Process:
    args = [
        sys.executable,
        "-m",
        "tests.store.agent_process",
        "--serve",
        serve,
        "--redis",
        redis_url,
        "--namespace",
        namespace,
        "--ttl",
        str(TTL_S),
        "--ceiling",
        str(ceiling),
        "--agents",
        str(AGENTS),
    ]
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    popen = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    process = Process(popen)
    process.start_reading()
    return process


class EngineWatch:
    """Samples the engine every few milliseconds: the blocks reserved by its budgets in
    use (holding KV: a request runs in them, or their context is retained), its running
    requests, and its preemptions.

    A budget that holds nothing is left out of the reservations: a process paused in
    the instant between recording its budget on the store and opening it on the engine,
    and reaped meanwhile, opens it as it resumes and closes it as soon as it finds its
    lease expired, before any request runs in it (``max_empty_reserved`` counts it)."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.max_reserved = 0
        self.max_empty_reserved = 0  # the same counting every open budget, empty or not
        self.max_running = 0
        self.num_samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> EngineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            snap = self.backend.kv_snapshot()
            budgets = snap.budgets.values()
            reserved = sum(b.max_blocks for b in budgets if b.device_block_ids)
            self.max_empty_reserved = max(
                self.max_empty_reserved, sum(b.max_blocks for b in budgets)
            )
            running = self.backend.metrics().num_requests_running
            self.max_reserved = max(self.max_reserved, reserved)
            self.max_running = max(self.max_running, running)
            self.num_samples += 1


def store_keys(redis_server: RedisServer, namespace: str) -> list[str]:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    try:
        return sorted(k.decode() for k in client.scan_iter(f"kvgov:{{{namespace}}}:lease:*"))
    finally:
        client.close()


def proc_alive(redis_server: RedisServer, namespace: str, proc: str) -> bool:
    """Whether the store still counts anything of ``proc``: its heartbeat entry, or a
    lease of it (closing ones included)."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    try:
        prefix = f"kvgov:{{{namespace}}}:"
        if client.zscore(prefix + "procs", proc) is not None:
            return True
        return any(
            k.decode().startswith(f"{prefix}lease:{proc}.")
            for k in client.scan_iter(f"{prefix}lease:*")
        )
    finally:
        client.close()


def store_dump(redis_server: RedisServer, namespace: str) -> dict[str, Any]:
    """The namespace's procs and leases, for a failing assertion's message."""
    import redis

    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        prefix = f"kvgov:{{{namespace}}}:"
        leases = {k: client.hgetall(k) for k in client.scan_iter(f"{prefix}lease:*")}
        procs = client.zrange(prefix + "procs", 0, -1, withscores=True)
        closing = client.zrange(prefix + "closing", 0, -1, withscores=True)
        return {"procs": procs, "closing": closing, "leases": leases}
    finally:
        client.close()
