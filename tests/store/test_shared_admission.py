"""Governors that share one budget on a real redis-server: each of them is what one
process builds (its own connection, heartbeat and subscriber threads, its own process id
on the store); here several run in one test process, which the multi-process tests
(test_processes.py) do not need to repeat for the ledger's rules."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import pytest

from governor import (
    AdmissionMode,
    AgentSpec,
    Governor,
    GovernorConfig,
    Lease,
    LeaseState,
    Policies,
)
from governor.errors import AdmissionTimeout, ConfigError, LeaseExpired
from governor.store import RedisStore
from governor.testing import FakeBackend
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 16
# 40 blocks at safety 1.0: two leases of 20 blocks (320 tokens) at once
WORKER = AgentSpec(name="worker", ceiling_tokens=20 * BLOCK)


def backend() -> FakeBackend:
    return FakeBackend(num_blocks=40, block_size=BLOCK)


@pytest.fixture
def governors(
    redis_server: RedisServer, namespace: str, request: pytest.FixtureRequest
) -> Iterator[list[Governor]]:
    """Three governors on one store and namespace, as three processes driving one engine
    would be; a TTL of 1 s unless the test is marked ``ttl(seconds)``."""
    mark = request.node.get_closest_marker("ttl")
    ttl_s = 1.0 if mark is None else float(mark.args[0])
    store = RedisStore(redis_server.url, namespace=namespace, lease_ttl_s=ttl_s)
    config = GovernorConfig(safety_factor=1.0, admission_timeout_s=10)
    engine = backend()
    with ExitStack() as stack:
        made = [
            stack.enter_context(Governor(engine, config=config, agents=[WORKER], store=store))
            for _ in range(3)
        ]
        yield made


@pytest.mark.ttl(60.0)  # heartbeats 20 s apart: a wake-up within 1 s is the message's
def test_governors_on_one_store_admit_against_one_budget(governors: list[Governor]) -> None:
    a, b, c = governors
    first, second = a.lease("worker"), b.lease("worker")
    held = [first.__enter__(), second.__enter__()]
    assert [lease.state for lease in held] == [LeaseState.ACTIVE] * 2
    assert c.admission.counts()[:2] == (2, 0)
    admitted = threading.Event()

    def third() -> None:
        with c.lease("worker") as lease:
            assert lease.state is LeaseState.ACTIVE
            admitted.set()

    thread = threading.Thread(target=third)
    thread.start()
    deadline = time.monotonic() + 5
    while c.admission.counts()[1] != 1:  # queued on the store, not admitted: no room
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not admitted.is_set()
    started = time.monotonic()
    first.__exit__(None, None, None)  # room made by another process wakes it
    assert admitted.wait(5)
    woken_s = time.monotonic() - started
    thread.join()
    second.__exit__(None, None, None)
    assert a.admission.counts() == (0, 0, 2)  # the peak: never three at once
    reserved, summed, held_idle, held_sum = a.admission.ledger()
    assert (reserved, summed, held_idle, held_sum) == (0, 0, 0, 0)
    assert woken_s < 1.0  # by the store's message, not a heartbeat's second look


def test_async_waiter_cancelled_or_timed_out_leaves_nothing_queued(
    governors: list[Governor],
) -> None:
    a, b, _ = governors

    async def main() -> None:
        async with a.lease("worker"), a.lease("worker"):
            task = asyncio.create_task(b.lease("worker").__aenter__())
            while b.admission.counts()[1] != 1:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert b.admission.counts()[:2] == (2, 0)
        assert b.admission.counts()[:2] == (0, 0)

    asyncio.run(main())


def test_a_timed_out_waiter_leaves_the_queue(redis_server: RedisServer, namespace: str) -> None:
    store = RedisStore(redis_server.url, namespace=namespace)
    config = GovernorConfig(safety_factor=1.0, admission_timeout_s=0.2)
    with (
        Governor(backend(), config=config, agents=[WORKER], store=store) as a,
        Governor(backend(), config=config, agents=[WORKER], store=store) as b,
        a.lease("worker"),
        a.lease("worker"),
    ):
        with pytest.raises(AdmissionTimeout), b.lease("worker"):
            pass
        assert b.admission.counts()[:2] == (2, 0)


def test_a_paused_process_loses_its_lease_and_is_told(governors: list[Governor]) -> None:
    """The heartbeat of ``a`` stops (as a paused process's does); after the TTL the next
    operation of another governor reaps its lease, and ``a``'s next use of it raises
    ``LeaseExpired`` instead of booking the room twice."""
    a, b, _ = governors
    with a.lease("worker") as lease, a.lease("worker"):
        a.complete(lease, [{"role": "user", "content": "hi"}], max_tokens=2)
        a.admission.link._stop.set()  # its heartbeat stops (the thread ends)
        time.sleep(1.3)
        with b.lease("worker") as other:  # reaped on the way: room for it
            assert other.state is LeaseState.ACTIVE
            assert b.admission.counts()[0] == 1
        a.admission.link._stop.clear()
        with pytest.raises(LeaseExpired) as caught:
            a.complete(lease, [{"role": "user", "content": "again"}], max_tokens=2)
        assert caught.value.lease_id == lease.lease_id and caught.value.ttl_s == 1.0
        with a.lease("worker") as fresh:  # registered again: a new lease is admitted
            assert fresh.state is LeaseState.ACTIVE
            a.complete(fresh, [{"role": "user", "content": "anew"}], max_tokens=2)
    # the budget of the lease that made a call was closed by whoever reaped it, once
    assert b.reaped_budgets.wait_idle(5)
    assert b.reaped_budgets.num_closed == 1 and a.reaped_budgets.num_closed == 0
    assert not a.backend._pool._budgets  # the engine has no budget left open


@pytest.mark.ttl(60.0)
def test_a_governor_closed_with_leases_held_leaves_them_to_the_others_at_once(
    governors: list[Governor],
) -> None:
    """A process that closes its governor without releasing (an agent runtime shutting
    down) gives its room back at the next operation of another, not a TTL later."""
    a, b, _ = governors
    first, second = a.lease("worker").__enter__(), a.lease("worker").__enter__()
    a.complete(first, [{"role": "user", "content": "hi"}], max_tokens=2)  # a budget open
    assert (first.state, second.state) == (LeaseState.ACTIVE, LeaseState.ACTIVE)
    started = time.monotonic()
    a.close()
    with b.lease("worker") as lease:  # reaped on the way in: room for it
        assert lease.state is LeaseState.ACTIVE
    assert time.monotonic() - started < 5  # the TTL is 60 s
    assert b.reaped_budgets.wait_idle(5) and b.reaped_budgets.num_closed == 1
    assert b.admission.ledger() == (0, 0, 0, 0)


def test_tool_durations_are_every_process_s(governors: list[Governor]) -> None:
    """A tool's calls in one governor become the history another's retention reads."""
    a, b, _ = governors
    with a.lease("worker") as lease:
        for _ in range(3):
            with a.tool_call(lease, "search"):
                time.sleep(0.02)
    deadline = time.monotonic() + 5
    while b.tool_durations.mean("search") is None:  # brought back after b's heartbeat
        assert time.monotonic() < deadline, "b never heard of a's tool calls"
        time.sleep(0.02)
    mean, median = b.tool_durations.mean("search"), b.tool_durations.median("search")
    assert mean is not None and median is not None
    assert 0.02 <= mean < 0.5 and 0.02 <= median < 0.5
    own = a.tool_durations.mean("search")
    assert own is not None and abs(mean - own) < 1e-6


def test_the_governor_imports_and_runs_without_redis() -> None:
    """redis-py is the kvgov[redis] extra: ``import governor`` (and a governor on the
    in-process store) never imports it."""
    code = (
        "import sys; from governor import AgentSpec, Governor, RedisStore;"
        "from governor.testing import FakeBackend;"
        "g = Governor(FakeBackend(), agents=[AgentSpec(name='a', ceiling_tokens=64)]);"
        "lease = g.lease('a').__enter__(); g.release(lease);"
        "assert 'redis' not in sys.modules, 'redis was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_shared_store_refuses_what_it_cannot_share(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, namespace="refusals")
    overcommit = GovernorConfig(mode=AdmissionMode.OVERCOMMIT)
    with pytest.raises(ConfigError, match="overcommit's live use is one process's view"):
        Governor(backend(), config=overcommit, store=store)

    class NewestFirst:  # a policy of this process's own: the store cannot run it
        def order(
            self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float
        ) -> list[Lease]:
            return sorted(waiting, key=lambda lease: -lease.arrival)

    with pytest.raises(ConfigError, match="PriorityWithAging"):
        Governor(backend(), policies=Policies(admission=NewestFirst()), store=store)
    with pytest.raises(ConfigError, match="redis://"):
        RedisStore("http://127.0.0.1:6379")
    with pytest.raises(ConfigError, match="lease_ttl_s"):
        RedisStore(redis_server.url, lease_ttl_s=0)
