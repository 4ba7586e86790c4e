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

import os
import signal
import time
from pathlib import Path

import pytest

from backends.local.backend import LocalBackend
from tests.kvgov.serve.api_support import idle_metrics
from tests.redis_server import RedisServer
from tests.store.support import (
    AGENTS,
    TTL_S,
    EngineWatch,
    proc_alive,
    spawned,
    store_dump,
    store_keys,
)

pytestmark = pytest.mark.skipif(
    not os.environ.get("KVGOV_STORE_CHILD"),
    reason="run in a background child by tests/store/test_multiprocess.py "
    "(KVGOV_STORE_CHILD=1 runs them here)",
)


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
    print(
        f"killed process's leases gone in {gone_s:.2f} s (TTL {TTL_S} s); "
        f"most reserved by budgets in use {watch.max_reserved}, by all open "
        f"{watch.max_empty_reserved} (limit {limit})"
    )
