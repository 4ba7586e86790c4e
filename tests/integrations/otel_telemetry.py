"""What the tests of ``integrations.otel.instrument`` share (``test_otel.py``,
``test_otel_lifecycle.py``): ``Telemetry``, the real OpenTelemetry SDK's providers with an
``InMemorySpanExporter`` for spans and an ``InMemoryMetricReader`` for metrics (the
``telemetry`` fixture in ``conftest.py`` builds one per test), two agents, a task, a
governor that records its events, and small readers of spans and metric points."""

from __future__ import annotations

import dataclasses
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from governor import AgentSpec, Governor, GovernorConfig, GovernorEvent
from governor.testing import FakeBackend
from integrations.otel import Instrumentation, instrument

CODER = AgentSpec(name="coder", ceiling_tokens=400, tool_output_tokens=40)
WORKER = AgentSpec(name="worker", ceiling_tokens=400)
TASK = [{"role": "user", "content": "Fix the login test."}]


@dataclasses.dataclass
class Telemetry:
    spans: InMemorySpanExporter
    tracer_provider: TracerProvider
    reader: InMemoryMetricReader
    meter_provider: MeterProvider

    def instrument(self, governor: Governor, **options: Any) -> Instrumentation:
        return instrument(
            governor,
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            **options,
        )

    def finished(self, prefix: str = "") -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name.startswith(prefix)]

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return {
            m.name: list(m.data.data_points)
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        }


def _governor(backend: Any = None, **config: Any) -> tuple[Governor, list[GovernorEvent]]:
    governor = Governor(
        backend or FakeBackend(), config=GovernorConfig(**config), agents=[CODER, WORKER]
    )
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    return governor, events


def _parent(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _one(spans: list[ReadableSpan]) -> ReadableSpan:
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


def _events(span: ReadableSpan, name: str) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == name]


def _one_point(points: list[Any]) -> Any:
    assert len(points) == 1, points
    return points[0]
