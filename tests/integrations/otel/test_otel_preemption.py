"""A real engine preemption through ``integrations.otel.instrument``: two agents in
overcommit mode on ``LocalBackend`` (tiny-random, a pool of 18 four-token blocks) outgrow
the pool together, the engine preempts one of them, and the telemetry counts exactly what the engine
counted, on the metric and on the agents' spans (real OpenTelemetry SDK, in-memory)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from backends import LocalBackend
from governor import AdmissionMode, AgentSpec, Governor, GovernorConfig
from integrations.otel import instrument

BLOCK = 4
PROMPT_TOKENS = 8 * BLOCK  # each agent's prompt: 8 full blocks
MAX_TOKENS = 2 * BLOCK  # and 2 blocks of reply
# Both prompts and one agent's reply fit; both replies do not. The second agent is
# admitted only with room for its next token, so it starts within a few steps of the
# first, and from then on one of them must be preempted before both finish.
NUM_BLOCKS = 2 * 8 + 2
WORKER = AgentSpec(name="worker", ceiling_tokens=16 * BLOCK)  # within 90% of the pool


@pytest.fixture
def otel() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader, dict[str, Any]]]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    yield spans, reader, {"tracer_provider": tracer_provider, "meter_provider": meter_provider}
    tracer_provider.shutdown()
    meter_provider.shutdown()


def _messages(backend: LocalBackend, agent: int) -> list[dict[str, str]]:
    """A user message whose chat prompt is exactly PROMPT_TOKENS tokens."""
    for num_words in range(PROMPT_TOKENS, 0, -1):
        words = " ".join(f"w{agent}" for _ in range(num_words))
        messages = [{"role": "user", "content": words}]
        if backend.count_messages(messages) == PROMPT_TOKENS:
            return messages
    raise AssertionError(f"no message of {PROMPT_TOKENS} prompt tokens")


def _counter(reader: InMemoryMetricReader, name: str) -> int:
    data = reader.get_metrics_data()
    assert data is not None
    points = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]
    assert len(points) == 1, points
    return int(points[0].value)


def test_a_real_preemption_reaches_the_metric_and_the_agent_spans(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader, dict[str, Any]],
) -> None:
    spans, reader, providers = otel
    backend = LocalBackend(config={"num_blocks": NUM_BLOCKS, "block_size": BLOCK})
    try:
        config = GovernorConfig(mode=AdmissionMode.OVERCOMMIT, retain_s=0)
        governor = Governor(backend, config=config, agents=[WORKER])
        prompts = [_messages(backend, agent) for agent in range(2)]
        both_admitted = threading.Barrier(2, timeout=30)
        finish_reasons: list[str] = []
        errors: list[BaseException] = []

        def agent(messages: list[dict[str, str]], tenant: str) -> None:
            try:
                # One tenant each: no prefix-cache sharing, so every block is counted.
                with governor.lease("worker", tenant=tenant) as lease:
                    both_admitted.wait()  # the two calls reach the engine together
                    result = governor.complete(lease, messages, max_tokens=MAX_TOKENS)
                    finish_reasons.append(result.finish_reason)
            except BaseException as exc:  # re-raised in the test's thread below
                errors.append(exc)

        with instrument(governor, **providers):
            threads = [
                threading.Thread(target=agent, args=(m, f"tenant-{i}"), daemon=True)
                for i, m in enumerate(prompts)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
                assert not thread.is_alive(), "an agent's call did not finish"
            engine_preemptions = backend.metrics().num_preemptions
        if errors:
            raise errors[0]
        assert finish_reasons == ["length", "length"]  # preempted, resumed, finished
    finally:
        backend.close()
    # The setup forces it: a run without a preemption would prove nothing below.
    assert engine_preemptions >= 1
    assert _counter(reader, "kvgov.engine.preemptions") == engine_preemptions
    agents = [s for s in spans.get_finished_spans() if s.name == "invoke_agent worker"]
    assert len(agents) == 2
    on_spans = [
        int((event.attributes or {})["kvgov.engine.preemptions"])
        for span in agents
        for event in span.events
        if event.name == "kvgov.preempted"
    ]
    assert sum(on_spans) == engine_preemptions
