"""``kvgov bench processes``: governors sharing one KV budget on Redis (``RedisStore``),
beside the in-process store (``LocalStore``, the default) in the same run.

- ``admission_rtt_ms_p50`` (target <= 1 ms) and ``admission_rtt_ms_p99`` (<= 5 ms):
  ``with governor.lease(...)`` entered, the lease admitted at once (the store's script
  queues and admits it in one call), in one process with one governor per store on a
  ``FakeBackend``, so only the governor and its store are timed; the two stores' leases
  alternate, one at a time. The notes give ``LocalStore``'s percentiles beside them, and
  the server's script calls per lease (its ``INFO commandstats``, heartbeats included).
- ``leases_per_s`` (target >= 2,000): acquire + release per second across 4 processes
  (``processes_child``), each its own governor on a ``FakeBackend``, all four on one
  ``RedisStore`` namespace, looping one lease after another through windows that start
  at the same instant; the leases of all four over the window from the first start to
  the last end. The budget holds 1,000 leases, so nobody waits: the window times the
  store. The note gives the same four processes each on its own ``LocalStore`` (windows
  interleaved with Redis's), and the shared ledger's peak of active leases.
- ``governed_redis_over_local`` (target <= 1.10): the integrations benchmark's LangGraph
  run (a planner and 20 ReAct workers on a fake model sleeping 50 ms a call) governed on
  a ``FakeBackend`` with ``RedisStore`` over the same governed with ``LocalStore``: the
  median of the ratios of alternating pairs, after a warm-up of each.

The server: ``KVGOV_REDIS_URL`` where it is set (``redis://host:port/db``; the run's keys
go under namespaces of its own, ``bench-processes-<pid>-<random>``, deleted at the end),
else a ``redis-server`` from ``PATH`` started on a free loopback port without
persistence and stopped at the end (none on ``PATH``: the command fails, saying how to
install one). ``measure`` returns the figures with what a wrong
figure would break (the samples, the windows' counts, the shared ledgers after each part,
the children's exits, the keys left), for the benchmark's test.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from engine.benchmarks import Direction, Measurement
from governor import AgentSpec, FakeBackend, Governor, LeaseState, LocalStore, RedisStore
from governor.store import StateStore
from integrations.benchmarks.integrations import (
    MODEL_LATENCY_S,
    NUM_AGENTS,
    governed_run,
)
from kvgov.benchmarks.figure import spread
from kvgov.benchmarks.processes_child import CEILING_TOKENS, NUM_BLOCKS, WARMUP_LEASES
from kvgov.benchmarks.redis_server import delete_keys, redis_server

__all__ = [
    "NUM_PROCESSES",
    "ProcessesFacts",
    "ProcessesSizes",
    "Window",
    "measure",
    "percentile",
    "run",
]

NUM_PROCESSES = 4
_STORES = ("redis", "local")
_BENCH = "processes"
_CHILD = "kvgov.benchmarks.processes_child"
_GRAPH_BLOCKS = 16_384  # the integrations benchmark's: 20 workers and a planner at ceiling
_START_LEAD_S = 0.25  # from a window's orders to its start: each child reads its order
_STOP_TIMEOUT_S = 10.0
_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the kvgov package


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessesSizes:
    samples: int  # admission round trips timed on each store
    rounds: int  # leases_per_s windows on each store
    window_s: float
    pairs: int  # governed runs on each store, alternating

    @classmethod
    def of(cls, *, quick: bool) -> ProcessesSizes:
        if quick:
            return cls(samples=200, rounds=1, window_s=0.3, pairs=2)
        return cls(samples=2_000, rounds=3, window_s=3.0, pairs=31)


@dataclass(frozen=True, slots=True)
class Window:
    """One leases_per_s window: what each process did, on the machine's monotonic clock."""

    store: str
    counts: tuple[int, ...]  # acquire + release done by each process
    started: float  # the first process's start
    ended: float  # the last process's end
    cpu_s: float  # the processes' CPU time in the window, summed
    server_cpu_s: float  # the Redis server's meanwhile (its INFO), whichever store ran

    @property
    def num_leases(self) -> int:
        return sum(self.counts)

    @property
    def per_s(self) -> float:
        return self.num_leases / (self.ended - self.started)


@dataclass(slots=True)
class ProcessesFacts:
    sizes: ProcessesSizes
    server: str  # what served, for the notes
    rtt_s: dict[str, list[float]] = field(default_factory=dict)  # by store, each lease's
    script_calls: int = 0  # the server's script calls while the Redis leases were timed
    windows: list[Window] = field(default_factory=list)
    peak_active: int = 0  # the leases_per_s namespace's most active leases at once
    ledgers: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)  # by part
    exit_codes: list[int | None] = field(default_factory=list)  # the children's
    governed_s: dict[str, list[float]] = field(default_factory=dict)  # by store, each run's
    governed_cpu_s: dict[str, list[float]] = field(default_factory=dict)  # this process's CPU
    leases_held: bool = False  # a governed run's governor held a lease after the runs
    keys_deleted: int = 0  # the run's keys on the server, deleted at the end
    keys_left: int = 0
    measurements: list[Measurement] = field(default_factory=list)


def run(*, quick: bool = False) -> Iterator[Measurement]:
    yield from measure(quick=quick).measurements


def measure(*, quick: bool) -> ProcessesFacts:
    """Every part against one server (``redis_server``), then the figures."""
    sizes = ProcessesSizes.of(quick=quick)
    run_id = f"bench-processes-{os.getpid()}-{secrets.token_hex(3)}"
    with redis_server() as server:
        facts = ProcessesFacts(sizes, server.label)
        try:
            _round_trips(server.url, f"{run_id}-rtt", facts)
            _leases_per_s(server.url, f"{run_id}-leases", facts)
            _governed(server.url, f"{run_id}-graph", facts)
        finally:
            facts.keys_deleted, facts.keys_left = delete_keys(server.url, run_id)
    facts.measurements = list(_figures(facts))
    return facts


def percentile(values: list[float], p: int) -> float:
    """The ``p``-th percentile of ``values``, interpolated (the 50th is the median)."""
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


# -- the figures -------------------------------------------------------------------------
def _figures(facts: ProcessesFacts) -> Iterator[Measurement]:
    sizes, rtt = facts.sizes, facts.rtt_s
    ms = {(store, p): percentile(rtt[store], p) * 1e3 for store in _STORES for p in (50, 99)}
    per_lease = facts.script_calls / sizes.samples
    for p, target in ((50, 1.0), (99, 5.0)):
        yield Measurement(
            bench=_BENCH,
            metric=f"admission_rtt_ms_p{p}",
            value=ms["redis", p],
            unit="ms",
            target=target,
            direction=Direction.LOWER_IS_BETTER,
            note=(
                f"`with governor.lease(...)` entered, admitted at once: RedisStore "
                f"{ms['redis', p]:.3f} ms vs LocalStore {ms['local', p]:.3f} ms at the "
                f"{p}th percentile ({max(rtt['redis']) * 1e3:.2f} vs "
                f"{max(rtt['local']) * 1e3:.2f} ms at worst); {sizes.samples:,} leases on "
                f"each store, alternating, one at a time, in one process with one governor "
                f"per store on a FakeBackend; {per_lease:.2f} script calls on the server per "
                f"Redis lease (acquire + release, heartbeats included); {facts.server}"
            ),
        )
    windows = {store: [w for w in facts.windows if w.store == store] for store in _STORES}
    rates = {store: [w.per_s for w in windows[store]] for store in _STORES}
    leases = {store: sum(w.num_leases for w in windows[store]) for store in _STORES}
    own_us = {
        store: 1e6 * sum(w.cpu_s for w in windows[store]) / leases[store] for store in _STORES
    }
    server_us = 1e6 * sum(w.server_cpu_s for w in windows["redis"]) / leases["redis"]
    yield Measurement(
        bench=_BENCH,
        metric="leases_per_s",
        value=statistics.median(rates["redis"]),
        unit="leases/s",
        target=2_000,
        direction=Direction.HIGHER_IS_BETTER,
        note=(
            f"acquire + release per second across {NUM_PROCESSES} processes sharing one "
            f"RedisStore namespace, each a governor on a FakeBackend looping one lease after "
            f"another (a budget of 1,000 leases: none waits), median of {sizes.rounds} "
            f"windows of {sizes.window_s:g} s ({_listed(rates['redis'])}); the same "
            f"{NUM_PROCESSES} processes each on its own LocalStore, windows interleaved: "
            f"{statistics.median(rates['local']):,.0f}/s ({_listed(rates['local'])}); the "
            f"shared ledger's peak: {facts.peak_active} leases active at once; CPU time per "
            f"lease: {own_us['redis']:.0f} us in the governors' processes and "
            f"{server_us:.0f} us in the server (its INFO), vs "
            f"{own_us['local']:.1f} us on LocalStore, on {os.cpu_count()} CPUs; "
            f"{facts.server}"
        ),
    )
    times, cpu = facts.governed_s, facts.governed_cpu_s
    wall_ms = {store: statistics.median(times[store]) * 1e3 for store in _STORES}
    cpu_ms = {store: statistics.median(cpu[store]) * 1e3 for store in _STORES}
    ratios = [r / lo for lo, r in zip(times["local"], times["redis"], strict=True)]
    yield Measurement(
        bench=_BENCH,
        metric="governed_redis_over_local",
        value=statistics.median(ratios),
        unit="x",
        target=1.10,
        direction=Direction.LOWER_IS_BETTER,
        note=(
            f"median of {sizes.pairs} alternating pairs (one pair's ratio scatters by "
            f"{spread(ratios) * 100:.1f}%, standard deviation): the integrations benchmark's "
            f"run (planner + {NUM_AGENTS} ReAct workers, a fake model sleeping "
            f"{MODEL_LATENCY_S * 1e3:g} ms per call) governed on a FakeBackend with "
            f"RedisStore vs with LocalStore; runs of {wall_ms['redis']:.1f} ms vs "
            f"{wall_ms['local']:.1f} ms, this process's CPU time per run (the store's threads "
            f"included) {cpu_ms['redis']:.1f} ms vs {cpu_ms['local']:.1f} ms (medians); "
            f"{facts.server}" + ("; leases left held" if facts.leases_held else "")
        ),
    )


def _listed(rates: list[float]) -> str:
    return ", ".join(f"{rate:,.0f}" for rate in rates)


# -- admission_rtt_ms ----------------------------------------------------------------------
def _round_trips(url: str, namespace: str, facts: ProcessesFacts) -> None:
    stores: dict[str, StateStore] = {
        "redis": RedisStore(url, namespace=namespace),
        "local": LocalStore(),
    }
    governors = _lease_governors(stores)
    try:
        for governor in governors.values():
            for _ in range(WARMUP_LEASES):
                with governor.lease("worker"):
                    pass
        client = RedisStore(url).client()
        try:
            calls = _script_calls(client)
            times = _timed_leases(governors, facts.sizes.samples)
            facts.script_calls = _script_calls(client) - calls
        finally:
            client.close()
        facts.rtt_s = times
        facts.ledgers["rtt"] = governors["redis"].admission.ledger()
    finally:
        for governor in governors.values():
            governor.close()


def _timed_leases(governors: dict[str, Governor], samples: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {store: [] for store in governors}
    for i in range(samples):
        for store in _STORES if i % 2 == 0 else _STORES[::-1]:
            governor = governors[store]
            started = time.perf_counter()
            with governor.lease("worker") as lease:
                times[store].append(time.perf_counter() - started)
                assert lease.state is LeaseState.ACTIVE
    return times


def _lease_governors(stores: dict[str, StateStore]) -> dict[str, Governor]:
    agent = AgentSpec(name="worker", ceiling_tokens=CEILING_TOKENS)
    governors: dict[str, Governor] = {}
    try:
        for name, store in stores.items():
            backend = FakeBackend(num_blocks=NUM_BLOCKS)
            governors[name] = Governor(backend, agents=[agent], store=store)
    except BaseException:
        for governor in governors.values():
            governor.close()
        raise
    return governors


def _script_calls(client: Any) -> int:
    stats = client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("eval", "evalsha")
    )


# -- leases_per_s ----------------------------------------------------------------------------
def _leases_per_s(url: str, namespace: str, facts: ProcessesFacts) -> None:
    sizes = facts.sizes
    path = os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", _CHILD, "--redis", url, "--namespace", namespace]
    children: list[subprocess.Popen[str]] = []
    client = RedisStore(url).client()
    with tempfile.TemporaryFile() as log:
        try:
            for _ in range(NUM_PROCESSES):
                children.append(
                    subprocess.Popen(
                        command,
                        env=env,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=log,
                        text=True,
                    )
                )
            for child in children:
                _answer(child, log)  # ready
            for i in range(sizes.rounds):
                for store in _STORES if i % 2 == 0 else _STORES[::-1]:
                    start_at = time.monotonic() + _START_LEAD_S
                    order = {"store": store, "start_at": start_at, "seconds": sizes.window_s}
                    server_cpu = _server_cpu_s(client)
                    for child in children:
                        assert child.stdin is not None
                        child.stdin.write(json.dumps(order) + "\n")
                        child.stdin.flush()
                    done = [_answer(child, log) for child in children]
                    window = Window(
                        store,
                        counts=tuple(int(each["count"]) for each in done),
                        started=min(float(each["started"]) for each in done),
                        ended=max(float(each["ended"]) for each in done),
                        cpu_s=sum(float(each["cpu_s"]) for each in done),
                        server_cpu_s=_server_cpu_s(client) - server_cpu,
                    )
                    facts.windows.append(window)
        finally:
            _stop(children)
            facts.exit_codes = [child.returncode for child in children]
            client.close()
    reader = Governor(
        FakeBackend(num_blocks=NUM_BLOCKS), store=RedisStore(url, namespace=namespace)
    )
    try:
        facts.peak_active = reader.admission.counts()[2]
        facts.ledgers["leases"] = reader.admission.ledger()
    finally:
        reader.close()


def _server_cpu_s(client: Any) -> float:
    """The Redis server's CPU time so far (its own threads included)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _answer(child: subprocess.Popen[str], log: IO[bytes]) -> dict[str, Any]:
    """The child's next JSON line; its log where it exited instead."""
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        child.wait(timeout=_STOP_TIMEOUT_S)
        log.seek(0)
        output = log.read().decode("utf-8", "replace")[-3000:]
        raise RuntimeError(f"a {_CHILD} process exited ({child.returncode}):\n{output}")
    answer: dict[str, Any] = json.loads(line)
    return answer


def _stop(children: list[subprocess.Popen[str]]) -> None:
    """Close each child's stdin (it closes its governors and exits); kill one that lingers."""
    for child in children:
        if child.stdin is not None:
            with suppress(OSError):
                child.stdin.close()
    for child in children:
        try:
            child.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=_STOP_TIMEOUT_S)
        if child.stdout is not None:
            child.stdout.close()


# -- governed_redis_over_local ---------------------------------------------------------------
def _governed(url: str, namespace: str, facts: ProcessesFacts) -> None:
    governors: dict[str, Governor] = {}
    try:
        governors["redis"] = Governor(
            FakeBackend(num_blocks=_GRAPH_BLOCKS), store=RedisStore(url, namespace=namespace)
        )
        governors["local"] = Governor(FakeBackend(num_blocks=_GRAPH_BLOCKS))
        runs = {store: governed_run(governor) for store, governor in governors.items()}
        times: dict[str, list[float]] = {store: [] for store in _STORES}
        cpu: dict[str, list[float]] = {store: [] for store in _STORES}

        async def measure_all() -> None:
            for store in _STORES:  # warm-up: imports, caches, the tokenizer, the script
                await runs[store].once()
            for i in range(facts.sizes.pairs):
                for store in _STORES if i % 2 == 0 else _STORES[::-1]:
                    started = time.process_time()
                    wall, _ = await runs[store].once()
                    cpu[store].append(time.process_time() - started)
                    times[store].append(wall)

        asyncio.run(measure_all())
        facts.governed_s, facts.governed_cpu_s = times, cpu
        facts.leases_held = any(each.leases_held for each in runs.values())
        facts.ledgers["graph"] = governors["redis"].admission.ledger()
    finally:
        for governor in governors.values():
            governor.close()
