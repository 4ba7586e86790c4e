"""How ``integrations.otel.instrument``'s spans end, with the real OpenTelemetry SDK
(``otel_telemetry.py``): ``uninstrument`` ends the open ones and stops; a lease never
admitted ends with its run; a lease outside any run nests under the current span; twenty
agents on threads and event loops leave none open. Then once on the bundled engine
(tiny-random, ``LocalBackend``) for offload and restore as events on the agent's span."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from backends import LocalBackend
from governor import AdmissionTimeout, ConfigError
from governor.testing import FakeBackend
from integrations.otel import instrument
from tests.integrations.otel_telemetry import (
    TASK,
    Telemetry,
    _events,
    _governor,
    _one,
    _one_point,
    _parent,
)


def test_uninstrument_ends_open_spans_and_stops(telemetry: Telemetry) -> None:
    governor, _ = _governor()
    handle = telemetry.instrument(governor)
    with governor.run("long"), governor.lease("coder") as lease:
        governor.complete(lease, TASK, max_tokens=5)
        with governor.tool_call(lease, "build"):
            assert handle.span_for(lease_id=lease.lease_id) is not None
            handle.uninstrument()
            handle.uninstrument()  # idempotent
            ended = {s.name: s for s in telemetry.finished()}
            assert set(ended) == {
                "invoke_workflow long",
                "invoke_agent coder",
                "chat fake-model",
                "execute_tool build",
            }
            agent = ended["invoke_agent coder"].attributes or {}
            assert agent["kvgov.span.ended_by"] == "uninstrument"
        governor.complete(lease, TASK, max_tokens=5)
    assert len(telemetry.finished()) == 4  # nothing after
    assert handle.span_for(lease_id=lease.lease_id) is None
    assert _one_point(telemetry.metrics()["kvgov.lease.active"]).value == 0
    assert "uninstrumented" in repr(handle)


def test_a_lease_never_admitted_ends_with_its_run(telemetry: Telemetry) -> None:
    backend = FakeBackend(num_blocks=32)  # one lease of 400 tokens at a time
    governor, _ = _governor(backend, admission_timeout_s=0.05)
    with (
        telemetry.instrument(governor),
        governor.run("crowded"),
        governor.lease("coder"),
        pytest.raises(AdmissionTimeout),
        governor.lease("worker"),
    ):
        pass
    worker = _one(telemetry.finished("invoke_agent worker"))
    assert worker.status.status_code is StatusCode.ERROR
    assert worker.attributes["error.type"] == "never admitted"  # type: ignore[index]
    assert worker.attributes["kvgov.span.ended_by"] == "run end"  # type: ignore[index]
    assert len(telemetry.finished()) == 3


def test_a_lease_outside_runs_nests_under_the_current_span(telemetry: Telemetry) -> None:
    governor, _ = _governor()
    tracer = telemetry.tracer_provider.get_tracer("app")
    handle = telemetry.instrument(governor)
    with handle, tracer.start_as_current_span("request"), governor.lease("coder") as lease:
        agent_span = handle.span_for(lease_id=lease.lease_id)
        assert agent_span is not None
        with trace.use_span(agent_span), tracer.start_as_current_span("retrieval"):
            pass
    spans = {s.name: s for s in telemetry.finished()}
    assert _parent(spans["invoke_agent coder"]) == spans["request"].context.span_id
    assert _parent(spans["retrieval"]) == spans["invoke_agent coder"].context.span_id
    with pytest.raises(ConfigError, match="Governor"):
        instrument("governor")  # type: ignore[arg-type]


def test_twenty_agents_on_threads_and_event_loops_leave_no_span_open(
    telemetry: Telemetry,
) -> None:
    backend = FakeBackend(num_blocks=64, latency_s=0.0005)  # two leases of 400 at once
    governor, events = _governor(backend, park_after_s=0)

    def threaded(i: int) -> None:
        with governor.lease("worker") as lease:
            governor.complete(lease, TASK, max_tokens=2 + i % 3)
            with governor.tool_call(lease, "grep"):
                pass
            governor.complete(lease, TASK, max_tokens=2)

    async def on_the_loop(i: int) -> None:
        async with governor.lease("worker") as lease:
            await governor.acomplete(lease, TASK, max_tokens=2 + i % 3)
            async with governor.tool_call(lease, "grep"):
                await asyncio.sleep(0)

    async def planner() -> None:
        async with governor.lease("coder") as lease:
            await governor.acomplete(lease, TASK, max_tokens=2)

            async def child(context: Any) -> None:
                async with context as worker:
                    await governor.acomplete(worker, TASK, max_tokens=2)

            await asyncio.gather(*(child(c) for c in governor.fanout(lease, "worker", 3)))
            await governor.acomplete(lease, TASK, max_tokens=2)

    async def main() -> None:
        with governor.run("swarm"):
            await asyncio.gather(*(on_the_loop(i) for i in range(8)), planner())

    with telemetry.instrument(governor) as handle:
        threads = [threading.Thread(target=threaded, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        asyncio.run(main())
        for thread in threads:
            thread.join(timeout=30)
        assert "0 leases open" in repr(handle)
    spans = telemetry.finished()
    ids = {s.context.span_id for s in spans}
    agents = [s for s in spans if s.name.startswith("invoke_agent")]
    assert len(agents) == sum(e.kind == "requested" for e in events) == 20
    assert len(telemetry.finished("chat")) == sum(e.kind == "call.started" for e in events)
    assert len(telemetry.finished("execute_tool")) == 16
    roots = ("invoke_workflow", "invoke_agent worker")  # threaded workers are outside the run
    assert all(_parent(s) in ids for s in spans if not s.name.startswith(roots))
    assert not any("kvgov.span.ended_by" in (s.attributes or {}) for s in spans)
    run = _one(telemetry.finished("invoke_workflow"))
    looped = [s for s in agents if s.attributes.get("kvgov.run.id")]  # type: ignore[union-attr]
    assert len(looped) == 12 and all(_parent(s) in ids for s in looped)
    assert sum(_parent(s) == run.context.span_id for s in agents) == 9  # 8 workers, 1 planner
    assert {p.value for p in telemetry.metrics()["kvgov.lease.active"]} == {0}


def test_offload_and_restore_on_the_bundled_engine(telemetry: Telemetry) -> None:
    backend = LocalBackend(config={"num_blocks": 64, "block_size": 16})
    try:
        # A watermark this low means pressure at every hold: the KV goes to host at once.
        config = {"park_after_s": 0, "retain_s": 30, "pressure_watermark": 0.01}
        governor, _ = _governor(backend, **config)
        with telemetry.instrument(governor), governor.lease("worker") as lease:
            first = governor.complete(lease, TASK, max_tokens=8)
            with governor.tool_call(lease, "grep"):
                pass
            history = [*TASK, {"role": "assistant", "content": first.text}]
            second = governor.complete(lease, history, max_tokens=8)
    finally:
        backend.close()
    agent = _one(telemetry.finished("invoke_agent"))
    names = [e.name for e in agent.events]
    assert names.index("kvgov.retained") < names.index("kvgov.offloaded")
    assert names.index("kvgov.offloaded") < names.index("kvgov.restored")
    (offloaded,) = _events(agent, "kvgov.offloaded")
    assert offloaded["kvgov.kv.blocks"] > 0 and "parked" in offloaded["kvgov.reason"]
    assert offloaded["kvgov.pressure.blocks_needed"] > 0  # the pressure it answered
    assert _events(agent, "kvgov.restored") == [{"kvgov.kv.blocks": offloaded["kvgov.kv.blocks"]}]
    assert (agent.attributes or {})["kvgov.kv.offloaded"] == 1
    chats = telemetry.finished("chat")
    assert [c.name for c in chats] == ["chat tiny-random"] * 2
    assert chats[0].attributes["gen_ai.provider.name"] == "local"  # type: ignore[index]
    assert [c.attributes["kvgov.prefix.cached_tokens"] for c in chats] == [  # type: ignore[index]
        first.cached_tokens,
        second.cached_tokens,
    ]
