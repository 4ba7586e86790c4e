"""The server is killed (SIGKILL) mid-run and started again on the same port: calls in
flight fail with the typed, retriable ``BackendUnavailable``; the next call notices the
new instance, the budgets of the governor's open leases are opened again and its
prefixes pinned again; the holds the restart lost are forgotten; no lease is lost or
counted twice, and once the leases end nothing is left on the server or in the ledger.

A real ``kvgov serve`` process (the session's, ``tests/conftest.py``): this test kills
it and leaves a fresh one running on the same port for the tests after it.
"""

from __future__ import annotations

import asyncio

import pytest

from backends.remote.backend import RemoteBackend
from governor import AgentSpec, BackendUnavailable, Governor, GovernorConfig, GovernorEvent
from tests.serve_process import ServerProcess

SYSTEM = "You are a careful build engineer. Answer in one line. " * 3
AGENT = AgentSpec(name="agent", ceiling_tokens=320, prefix="sys")
TASK = [{"role": "user", "content": "Find the failing test."}]


def test_a_restart_fails_calls_in_flight_and_the_governor_carries_on(
    kvgov_server: ServerProcess,
) -> None:
    kvgov_server.prepare()  # the replacement builds its engine while this test runs
    backend = RemoteBackend(kvgov_server.base_url)
    config = GovernorConfig(park_after_s=0, retain_s=30, pressure_watermark=1.0)
    governor = Governor(backend, config=config, agents=[AGENT])
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    handle = governor.register_prefix("sys", SYSTEM)
    assert handle.num_blocks > 0
    first_instance = backend._session.instance

    async def run() -> None:
        async with governor.lease("agent") as held, governor.lease("agent") as streaming:
            await governor.acomplete(held, TASK, max_tokens=4)
            async with governor.tool_call(held, "grep"):
                assert held.num_retained_tokens > 0  # KV held on the first server
            stream = governor.astream(streaming, TASK, max_tokens=200)
            await anext(stream)  # a call in flight...
            kvgov_server.kill()  # ...when the server dies
            with pytest.raises(BackendUnavailable) as caught:
                async for _ in stream:
                    pass
            assert caught.value.retriable
            await stream.aclose()
            with pytest.raises(BackendUnavailable):  # nobody there: typed, not a hang
                await governor.acomplete(streaming, TASK, max_tokens=4)

            await asyncio.to_thread(kvgov_server.start)
            # Any call notices the restart first (here a metrics poll, as the OTel
            # sampler makes): budgets and pins are set up again before it runs, and
            # the hold the restart lost is forgotten, so admission stops counting it.
            await backend.ametrics()
            assert backend._session.instance != first_instance
            assert backend.num_restarts == 1
            assert held.num_retained_tokens == 0
            result = await governor.acomplete(held, TASK, max_tokens=4)
            # The prefix was pinned again: the call started with it and hit its blocks.
            assert result.cached_tokens >= handle.num_pinned_tokens
            assert backend.capacity().num_pinned_blocks == handle.num_blocks
            # Both leases' budgets are open again at their sizes, nothing else.
            budgets = backend.kv_map().budgets
            assert {name: b.max_blocks for name, b in budgets.items()} == {
                held.budget: held.blocks_reserved,
                streaming.budget: streaming.blocks_reserved,
            }
            again = await governor.acomplete(streaming, TASK, max_tokens=4)  # the retry works
            assert again.completion_tokens == 4
            reserved, summed, held_idle, held_summed = governor.admission.ledger()
            assert (reserved, held_idle) == (summed, held_summed)
            assert (
                reserved == held.own_blocks_reserved + streaming.own_blocks_reserved
            )  # no lease twice

    asyncio.run(run())
    dropped = [e for e in events if e.kind == "dropped"]
    assert [e.attributes["reason"] for e in dropped] == ["the backend restarted; its KV is gone"]
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert governor.admission.counts()[:2] == (0, 0)
    assert backend.kv_map().budgets == {}  # every budget closed on the new server
    governor.unregister_prefix("sys")
    m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_blocks_pinned, m.num_requests_running) == (0, 0, 0)
    backend.close()
