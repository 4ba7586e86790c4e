"""The governor behaves the same in process and remote: one planner fans out to four
workers, two at a time (fan-out, parking the planner), under admission that holds three
leases of this size at once; each worker's conversation grows past its ceiling every
turn and is compacted by ``SummarizeOldest`` (the policy counts with the backend's own
counter: a remote count that differed would compact differently). Run on a
``LocalBackend`` and on a ``RemoteBackend`` to a kvgov serve process with the same pool,
the calls' prompts, their compactions and the admission limits agree exactly, and both
return every block and lease.

Replies are not fed back into the conversations: a batch composed differently may change
a greedy token of the random model, and what is compared here is the governor's work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from backends import LocalBackend
from backends.remote.backend import RemoteBackend
from governor import AgentSpec, Backend, Governor, GovernorConfig, GovernorEvent, Policies
from policies import SummarizeOldest
from tests.serve_process import ServerProcess

PLANNER = AgentSpec(name="planner", ceiling_tokens=256, max_fanout=2)
WORKER = AgentSpec(name="worker", ceiling_tokens=256)
NUM_WORKERS = 4
TOOL_OUTPUT = "tests/test_api.py::test_login FAILED: expected 200, got 500\n" * 6

Trace = tuple[int, list[tuple[str, int, int, str]], list[tuple[str, int, int]]]


@pytest.fixture(params=["local", "remote"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "remote":
        server: ServerProcess = request.getfixturevalue("kvgov_server")
        assert server.config == {"num_blocks": 64, "block_size": 16}
        with RemoteBackend(server.base_url) as remote:
            yield remote
        return
    with LocalBackend(config={"num_blocks": 64, "block_size": 16}) as local:
        yield local


def _swarm(backend: Backend) -> Trace:
    policies = Policies(ceiling=SummarizeOldest(summary_tokens=24))
    config = GovernorConfig(park_after_s=0, retain_s=0)
    governor = Governor(backend, config=config, agents=[PLANNER, WORKER], policies=policies)
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)

    async def worker(child: object, number: int) -> None:
        async with child as lease:  # type: ignore[attr-defined]
            history = [{"role": "user", "content": f"Worker {number}: find the failing test."}]
            for turn in range(3):
                await governor.acomplete(lease, history, max_tokens=4)
                history.append({"role": "user", "content": f"Turn {turn}:\n{TOOL_OUTPUT}"})

    async def main() -> int:
        async with governor.lease("planner") as planner:
            await governor.acomplete(planner, [{"role": "user", "content": "Plan."}], max_tokens=4)
            children = governor.fanout(planner, "worker", NUM_WORKERS)
            await asyncio.gather(*(worker(child, i) for i, child in enumerate(children)))
            await governor.acomplete(planner, [{"role": "user", "content": "Merge."}], max_tokens=4)
        return governor.admission.counts()[2]

    peak = asyncio.run(main())
    calls = sorted(
        (
            e.agent or "",
            e.attributes["prompt_tokens"],
            e.attributes["completion_tokens"],
            e.attributes["finish_reason"],
        )
        for e in events
        if e.kind == "call.finished"
    )
    compactions = sorted(
        (e.agent or "", e.record.tokens_before, e.record.tokens_after)  # type: ignore[union-attr]
        for e in events
        if e.kind == "compacted"
    )
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert governor.admission.counts()[:2] == (0, 0)
    m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_requests_running, m.num_blocks_swapped) == (0, 0, 0)
    return peak, calls, compactions


_traces: dict[str, Trace] = {}


def test_the_same_swarm_does_the_same_work(backend: Backend) -> None:
    limit = Governor(backend, agents=[WORKER]).admission.max_concurrent(WORKER.ceiling_tokens)
    assert limit == 3  # floor(64 blocks x 0.9 / 16 blocks a lease)
    peak, calls, compactions = trace = _swarm(backend)
    assert peak <= limit
    assert len(calls) == 2 + 3 * NUM_WORKERS
    assert len(compactions) >= NUM_WORKERS  # every worker outgrew its ceiling
    _traces[backend.name] = trace
    if len(_traces) == 2:  # both ran: in process and remote did the same work
        assert _traces["local"][1:] == _traces["remote"][1:]
