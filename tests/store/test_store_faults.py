"""The store going away in the middle of a run of 4 agent processes on kvgov serve:
redis-server stopped and started again on its port, with its data (an RDB snapshot
written at shutdown) and without (restarted empty).

While it is down new leases fail fast with ``StoreUnavailable`` (the agents retry),
admitted leases keep running their calls, and releases wait to be sent. Once it is back:
no admission ever passed the budget (the engine's own reservations, sampled throughout),
no lease was lost or counted twice (every agent finishes, the store ends empty), and no
process hangs. Restarted empty, the processes register what they hold again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from backends.local.backend import LocalBackend
from tests.kvgov.serve.api_support import idle_metrics
from tests.redis_server import RedisServer
from tests.store.support import AGENTS, EngineWatch, spawned, store_keys

pytestmark = pytest.mark.skipif(
    not os.environ.get("KVGOV_STORE_CHILD"),
    reason="run in a background child by tests/store/test_multiprocess.py "
    "(KVGOV_STORE_CHILD=1 runs them here)",
)

DOWN_S = 1.5  # longer than the TTL: the store must not take the silence for deaths


@pytest.mark.parametrize("keep_data", [True, False], ids=["with-data", "emptied"])
def test_the_store_stopped_and_started_mid_run(
    serve: tuple[str, LocalBackend], tmp_path: Path, namespace: str, keep_data: bool
) -> None:
    url, backend = serve
    capacity = backend.capacity()
    ceiling_blocks = capacity.num_available_blocks // AGENTS
    limit = ceiling_blocks * AGENTS
    server = RedisServer(tmp_path, save=keep_data).start()
    until = tmp_path / "stop"
    work = {"turns": 3, "think_s": 0.1, "until": until, "retry_s": 60}
    args = (url, server.url, namespace, ceiling_blocks * capacity.block_size)
    preemptions = backend.metrics().num_preemptions
    try:
        with EngineWatch(backend) as watch, spawned(4, *args, **work) as processes:
            for process in processes:
                process.wait_for("admitted")
            server.stop() if keep_data else server.kill()
            time.sleep(DOWN_S)
            server.start()
            # running again: leases admitted after the store came back, in every process
            counts = [len(process.events("admitted")) for process in processes]
            for process, seen in zip(processes, counts, strict=True):
                process.wait_for("admitted", seen + 1)
            until.touch()
            for process in processes:
                process.wait_for("done", timeout_s=120)
                assert process.popen.wait(timeout=30) == 0, process.stderr()
        assert watch.max_reserved <= limit, (watch.max_reserved, limit)
        assert backend.metrics().num_preemptions == preemptions
        for process in processes:
            ends = [line for line in process.lines if line.get("event") not in ("admitted",)]
            assert len(process.events("finished")) == AGENTS, ends
        # new leases were refused while it was down, at once, with StoreUnavailable
        refused = [line["after_s"] for p in processes for line in p.events("refused")]
        assert refused and max(refused) < 1.0, refused
        assert store_keys(server, namespace) == []
        assert backend.kv_snapshot().budgets == {}
        assert idle_metrics(backend).num_blocks_in_use == 0
    finally:
        server.kill()
