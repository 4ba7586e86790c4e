"""Fixtures for the integration tests: ``telemetry``, the OpenTelemetry SDK in memory
(``otel_telemetry.Telemetry``), for the tests of ``integrations.otel.instrument``
(``test_otel.py``, ``test_otel_lifecycle.py``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.integrations.otel_telemetry import Telemetry


@pytest.fixture
def telemetry(caplog: pytest.LogCaptureFixture) -> Iterator[Telemetry]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    with caplog.at_level(logging.WARNING):
        yield Telemetry(spans, tracer_provider, reader, meter_provider)
    tracer_provider.shutdown()
    meter_provider.shutdown()
    # No handler failed, and no span was ended twice or written to after it ended.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
