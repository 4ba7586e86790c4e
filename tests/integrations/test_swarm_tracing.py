"""A governed LangGraph swarm, traced: a planner sends 10 ReAct-style workers whose tools
return realistic outputs of 8,000-16,000 characters (the demo's swarm, on
``FakeBackend`` for speed; the control flow is scripted because no offline model calls
tools). Checked: the fan-out cap, every context within its ceiling, every tool result
within ``tool_output_tokens``, and spans and metrics captured with the real SDK's
``InMemorySpanExporter`` and ``InMemoryMetricReader``, nested run > agent > call."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from governor import (
    AdmissionMode,
    AgentSpec,
    FakeBackend,
    Governor,
    GovernorConfig,
    GovernorEvent,
    Policies,
)
from integrations import instrument
from kvgov.demo.swarm import SwarmSpec, build_swarm
from policies import ExtractiveSummarizer

PLANNER = AgentSpec(name="planner", ceiling_tokens=2_048, max_fanout=3)
WORKER = AgentSpec(name="worker", ceiling_tokens=4_096, tool_output_tokens=600)


def _run() -> tuple[Governor, list[GovernorEvent], list[ReadableSpan], Any]:
    backend = FakeBackend(num_blocks=4_096, block_size=16)
    policies = Policies(tool_output=ExtractiveSummarizer(backend.counter))
    config = GovernorConfig(mode=AdmissionMode.OVERCOMMIT, park_after_s=0)
    governor = Governor(backend, config=config, agents=[PLANNER, WORKER], policies=policies)
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    handle = instrument(
        governor, tracer_provider=tracer_provider, meter_provider=MeterProvider([reader])
    )
    spec = SwarmSpec(
        num_workers=10, turns=2, reply_tokens=8, planner=PLANNER, worker=WORKER,
        system_in_messages=True,
    )  # fmt: skip
    swarm = build_swarm(governor, spec)
    done = asyncio.run(swarm.graph.ainvoke(swarm.inputs()))
    handle.uninstrument()
    assert len(done["reports"]) == 10 and not done["failures"]
    assert governor.admission.counts()[:2] == (0, 0)
    assert backend.metrics().num_blocks_in_use == 0
    return governor, events, list(spans.get_finished_spans()), reader.get_metrics_data()


def test_a_traced_swarm_keeps_every_limit_and_nests_its_spans() -> None:
    governor, events, spans, metrics = _run()
    # At most max_fanout workers active at once.
    active: set[str] = set()
    peak = 0
    workers = {e.lease_id for e in events if e.kind == "requested" and e.agent == "worker"}
    for event in events:
        if event.lease_id in workers and event.kind in ("admitted", "resumed"):
            active.add(event.lease_id)
            peak = max(peak, len(active))
        elif event.lease_id in workers and event.kind in ("parked", "released"):
            active.discard(event.lease_id)
    assert len(workers) == 10 and 1 < peak <= 3
    # Every context within its ceiling, every tool result within the tool budget.
    for event in events:
        if event.kind == "call.finished":
            assert event.attributes["tokens_in_context"] <= 4_096
        if event.kind == "summarized":
            assert event.record.tokens_after <= 600 < event.record.tokens_before
            assert governor.counter.count(event.record.text) == event.record.tokens_after
    assert sum(e.kind == "summarized" for e in events) == 20  # 10 workers x 2 tools

    # Spans: one run; agents under it (workers under the planner); calls under agents.
    by_id = {span.context.span_id: span for span in spans}
    names = Counter(span.name.split(" ")[0] for span in spans)
    assert names["invoke_workflow"] >= 1 and names["invoke_agent"] >= 11
    assert names["chat"] == 10 * 3 + 2 and names["execute_tool"] == 20
    runs = [s for s in spans if s.name.startswith("invoke_workflow")]
    root = next(s for s in runs if s.parent is None)
    for span in spans:
        if span is not root:
            assert span.context.trace_id == root.context.trace_id
    worker_parents = set()
    for span in spans:
        parent = by_id.get(span.parent.span_id) if span.parent else None
        if span.name == "invoke_agent worker":
            assert parent is not None and parent.name == "invoke_agent planner"
            worker_parents.add(parent.context.span_id)  # under the planner that sent them
        if span.name.startswith(("chat", "execute_tool")):
            assert parent is not None and parent.name.startswith("invoke_agent")
            assert span.attributes["gen_ai.agent.name"] == parent.name.split(" ", 1)[1]
    assert len(worker_parents) == 1
    chat = next(s for s in spans if s.name.startswith("chat") and "worker" in str(s.attributes))
    for name in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
                 "kvgov.lease.ceiling_tokens", "kvgov.seq.tokens"):  # fmt: skip
        assert name in chat.attributes, name
    # Metrics: the names the issue lists were recorded.
    recorded = {
        metric.name
        for resource in metrics.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert {
        "gen_ai.client.token.usage",
        "kvgov.kv.blocks_in_use",
        "kvgov.kv.blocks_free",
        "kvgov.seq.tokens",
        "kvgov.admission.wait",
        "kvgov.lease.active",
    } <= recorded
