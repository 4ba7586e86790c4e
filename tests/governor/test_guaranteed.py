"""Guaranteed mode never preempts, and the promise can fail: calls that grow to their
ceiling, agents parked on tool calls with their KV held, on the bundled engine
(tiny-random) with a pool that guaranteed mode fills exactly. Overcommit, on the same
workload, does preempt; guaranteed counts the KV that parked leases hold (and moves it
to host memory when it is all that keeps a waiting lease out), so it never does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from backends import LocalBackend
from governor import AdmissionMode, AgentSpec, Governor, GovernorConfig, GovernorEvent, LeaseState
from governor.testing import FakeBackend

WORKER = AgentSpec(name="worker", ceiling_tokens=64)  # 4 blocks of 16 tokens
TASK = "Task {i}: fix the build"


@pytest.fixture(scope="module")
def backend() -> Iterator[LocalBackend]:
    made = LocalBackend(config={"num_blocks": 24})  # 6 leases of 4 blocks, nothing spare
    yield made
    made.close()


def _swarm(backend: LocalBackend, mode: AdmissionMode) -> tuple[int, int, list[GovernorEvent]]:
    """Ten agents: a call that fills the ceiling, a tool (parked at once, KV held), a
    second call that fills it again. Returns (preemptions, peak active, events)."""
    # Holds stay on the device: no offload at a watermark (only what admission moves).
    config = GovernorConfig(
        mode=mode, safety_factor=1.0, park_after_s=0, retain_s=30, pressure_watermark=1.0
    )
    governor = Governor(backend, config=config, agents=[WORKER])
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    before = backend.metrics().num_preemptions

    async def agent(i: int) -> None:
        async with governor.lease("worker") as lease:
            messages = [{"role": "user", "content": TASK.format(i=i)}]
            for turn in range(2):
                room = WORKER.ceiling_tokens - backend.count_messages(messages) - 1
                result = await governor.acomplete(lease, messages, max_tokens=room)
                assert result.prompt_tokens + result.completion_tokens == 63  # grown to it
                if turn == 0:
                    async with governor.tool_call(lease, "pytest"):
                        await asyncio.sleep(0.1)
                    messages += [
                        {"role": "assistant", "content": "Looked."},
                        {"role": "user", "content": "Again."},
                    ]

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(agent(i) for i in range(10))), timeout=120)

    asyncio.run(main())
    m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_blocks_swapped, m.num_requests_running) == (0, 0, 0)
    return m.num_preemptions - before, governor.admission.counts()[2], events


def test_guaranteed_mode_never_preempts_where_overcommit_does(backend: LocalBackend) -> None:
    preempted, peak, _ = _swarm(backend, AdmissionMode.OVERCOMMIT)
    assert preempted > 0 and peak == 10  # the workload does run the pool short
    preempted, peak, events = _swarm(backend, AdmissionMode.GUARANTEED)
    assert preempted == 0
    assert peak == 6  # 24 blocks / 4 at the ceiling
    assert sum(e.kind == "retained" for e in events) == 10  # every parked agent held KV


def test_guaranteed_mode_counts_a_parked_leases_hold_and_moves_it_for_a_waiter() -> None:
    """A parked lease's held KV counts against guaranteed admission (it is on the
    device); when it alone keeps a waiting lease out, it is offloaded and the waiter
    admitted, and the ledger equals the leases throughout."""
    backend = FakeBackend(num_blocks=100, block_size=16)  # limit 90: one 1,600 and a bit
    agent = AgentSpec(name="agent", ceiling_tokens=1_440)  # 90 blocks
    config = GovernorConfig(park_after_s=0, retain_s=30)
    governor = Governor(backend, config=config, agents=[agent])
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    long_task = [{"role": "user", "content": "word " * 300}]  # about 19 blocks
    with governor.lease("agent") as first:
        governor.complete(first, long_task, max_tokens=8)
        with governor.tool_call(first, "build"):
            assert first.state is LeaseState.PARKED and first.num_retained_blocks > 0
            reserved, _, held, held_sum = governor.admission.ledger()
            assert (reserved, held) == (0, held_sum) == (0, first.num_retained_blocks)
            with governor.lease("agent") as second:  # 90 + the hold > 90: it is moved
                assert second.state is LeaseState.ACTIVE
                assert first.kv_offloaded
                assert governor.admission.ledger() == (90, 90, 0, 0)
                governor.complete(second, long_task, max_tokens=8)
        governor.complete(first, long_task, max_tokens=8)  # restored from host
    kinds = [e.kind for e in events]
    assert kinds.index("offloaded") < kinds.index("restored")
    assert governor.admission.ledger() == (0, 0, 0, 0)
    m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_blocks_swapped) == (0, 0)
    assert backend.peak_blocks_in_use <= 100
