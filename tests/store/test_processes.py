"""Governors in real processes (subprocesses, not threads) sharing one budget on a real
redis-server, driving the bundled engine behind kvgov serve (served from this test's
process, whose engine this test reads directly).

The chaos run: 4 processes x 8 agents on a budget sized for 8 agents at their ceilings;
one process is SIGKILLed and another SIGSTOPped past the TTL mid-run. The engine's own
view (its open budgets' reservations, its running requests, its preemptions) is sampled
throughout and never passes the budget; the killed process's leases are gone within TTL
+ 1 s; every agent of the paused process ends with LeaseExpired; every other agent
finishes; nothing is held at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from backends.local.backend import LocalBackend
from kvgov.serve.background import running_server
from tests.kvgov.serve.api_support import idle_metrics, served_app
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
TTL_S = 1.0
AGENTS = 8
NUM_BLOCKS = 64


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
        sys.executable, "-m", "tests.store.agent_process",
        "--serve", serve, "--redis", redis_url, "--namespace", namespace,
        "--ttl", str(TTL_S), "--ceiling", str(ceiling), "--agents", str(AGENTS),
    ]  # fmt: skip
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
    """Samples the engine every few milliseconds: the blocks its open budgets reserve,
    its running requests, and its preemptions."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.max_reserved = 0
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
            reserved = sum(budget.max_blocks for budget in snap.budgets.values())
            running = self.backend.metrics().num_requests_running
            self.max_reserved = max(self.max_reserved, reserved)
            self.max_running = max(self.max_running, running)
            self.num_samples += 1


@pytest.fixture(scope="module")
def serve() -> Iterator[tuple[str, LocalBackend]]:
    with served_app(num_blocks=NUM_BLOCKS) as (app, backend), running_server(app) as (url, _):
        yield url, backend


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


def test_four_processes_one_killed_one_paused_keep_one_budget(
    serve: tuple[str, LocalBackend], redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    url, backend = serve
    capacity = backend.capacity()
    ceiling_blocks = capacity.num_available_blocks // AGENTS  # 8 leases fit, a 9th never
    limit = ceiling_blocks * AGENTS
    ceiling = ceiling_blocks * capacity.block_size
    preemptions = backend.metrics().num_preemptions
    long = {"turns": 40, "think_s": 0.2}  # 8 s and more an agent: still running when hit
    # the others take lease after lease until told to stop: they reach the store all
    # through the test (and, were they all to stop, the silence would read as an outage)
    until = tmp_path / "stop"
    work = {"turns": 3, "think_s": 0.1, "until": until}
    args = (url, redis_server.url, namespace, ceiling)
    with EngineWatch(backend) as watch, spawned(1, *args, **long) as (killed,):
        killed.wait_for("admitted", AGENTS)  # it holds the whole budget
        # the others queue behind it, on the store before the kill (else, nobody reaching
        # it, the store would take the silence for an outage and give everyone a TTL more)
        with (
            spawned(1, *args, **long) as (paused,),
            spawned(2, *args, **work) as others,
        ):
            for process in (paused, *others):
                process.wait_for_proc()
            assert not killed.events("finished")
            killed.popen.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            # the killed process's leases are gone within TTL + 1 s
            while proc_alive(redis_server, namespace, killed.proc):
                if time.monotonic() - killed_at > TTL_S + 1.0:
                    raise AssertionError(
                        f"its leases outlived TTL + 1 s: {store_dump(redis_server, namespace)}"
                    )
                time.sleep(0.02)
            gone_s = time.monotonic() - killed_at
            # its room went to the queue: to the paused process too, which stops there
            paused.wait_for("admitted")
            paused.popen.send_signal(signal.SIGSTOP)
            paused_at = time.monotonic()
            # the others, running on, reap it while it sleeps
            while proc_alive(redis_server, namespace, paused.proc):
                assert time.monotonic() - paused_at < TTL_S + 1.0, store_dump(
                    redis_server, namespace
                )
                time.sleep(0.02)
            paused.popen.send_signal(signal.SIGCONT)
            paused.wait_for("done", timeout_s=60)
            until.touch()
            for process in (paused, *others):
                process.wait_for("done", timeout_s=120)
                assert process.popen.wait(timeout=30) == 0, process.stderr()
        killed.popen.wait(timeout=10)
    # the engine's own view: never more reserved than the budget, never more than 8 running
    assert watch.num_samples > 50
    assert watch.max_reserved <= limit, (watch.max_reserved, limit)
    assert watch.max_running <= AGENTS
    assert backend.metrics().num_preemptions == preemptions  # nothing promised was taken back
    # the paused process was told, every agent of it; every other agent finished
    paused_ends = [
        line["event"]
        for line in paused.lines
        if line.get("agent") is not None and line["event"] != "admitted"
    ]
    errors = [line for line in paused.lines if line.get("event") == "error"]
    if errors:
        errors.append(paused.stderr()[-4000:])
    assert paused_ends and set(paused_ends) <= {"expired", "finished"}, errors
    assert "expired" in paused_ends
    for process in others:
        ends = [line for line in process.lines if line.get("event") not in ("admitted", "finished")]
        assert len(process.events("finished")) == AGENTS, ends
    # nothing left: no lease on the store, no budget open, no block reserved or in use
    assert store_keys(redis_server, namespace) == []
    assert backend.kv_snapshot().budgets == {}
    assert idle_metrics(backend).num_blocks_in_use == 0
    print(f"killed process's leases gone in {gone_s:.2f} s (TTL {TTL_S} s)")
