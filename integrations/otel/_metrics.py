"""The metric instruments ``integrations.otel`` records into, on one OpenTelemetry Meter.

- ``gen_ai.client.token.usage`` (histogram, ``{token}``): input and output tokens of each
  model call, by ``gen_ai.token.type``, as the GenAI conventions define it;
- ``kvgov.seq.tokens`` (histogram, ``{token}``): tokens in context after each model
  call, by ``gen_ai.agent.name``;
- ``kvgov.admission.wait`` (histogram, ``s``): each admission's wait, by agent;
- ``kvgov.lease.active`` (up-down counter, ``{lease}``): leases admitted and not parked
  or released, by agent;
- ``kvgov.kv.blocks_in_use`` and ``kvgov.kv.blocks_free`` (gauges, ``{block}``) and
  ``kvgov.engine.preemptions`` (counter): from ``backend.metrics()``.

The block gauges are synchronous gauges set whenever the instrumentation polls the
backend (when instrumented, after every model call, at every release and when a run
ends; on a sampler thread for async agents, ``integrations.otel._sampler``), not
observable ones: an SDK meter keeps the callbacks of the first observable
instrument of a name for good, so a governor instrumented a second time on the same
meter provider would report nothing, and a collection would call a backend that may
be closed by then.
"""

from __future__ import annotations

from opentelemetry.metrics import Meter

from integrations.otel import names as n

__all__ = ["GovernorMetrics"]

# The GenAI conventions' advised buckets for token counts and for durations.
_TOKEN_BUCKETS = tuple(float(4**i) for i in range(14))  # 1, 4, 16, ... 67,108,864
_SECONDS_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48)


class GovernorMetrics:
    """The instruments, and one method per thing recorded. ``token_usage=False`` leaves
    ``gen_ai.client.token.usage`` to another GenAI instrumentation."""

    def __init__(self, meter: Meter, *, provider: str, model: str, token_usage: bool) -> None:
        self._chat = {n.OPERATION: "chat", n.PROVIDER: provider, n.REQUEST_MODEL: model}
        self._engine = {n.PROVIDER: provider, n.REQUEST_MODEL: model}
        self._token_usage = (
            meter.create_histogram(
                n.METRIC_TOKEN_USAGE,
                unit="{token}",
                description="Input and output tokens of each model call",
                explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
            )
            if token_usage
            else None
        )
        self._seq_tokens = meter.create_histogram(
            n.METRIC_SEQ_TOKENS,
            unit="{token}",
            description="Tokens in an agent's context after each model call",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self._wait = meter.create_histogram(
            n.METRIC_ADMISSION_WAIT,
            unit="s",
            description="Seconds a lease waited to be admitted or resumed",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )
        self._active = meter.create_up_down_counter(
            n.METRIC_LEASE_ACTIVE, unit="{lease}", description="Leases admitted and running"
        )
        self._in_use = meter.create_gauge(
            n.METRIC_BLOCKS_IN_USE, unit="{block}", description="KV blocks in use"
        )
        self._free = meter.create_gauge(
            n.METRIC_BLOCKS_FREE, unit="{block}", description="KV blocks free"
        )
        self._preemptions = meter.create_counter(
            n.METRIC_PREEMPTIONS, unit="{preemption}", description="Engine preemptions"
        )

    def call_finished(
        self, agent: str, *, input_tokens: int, output_tokens: int, seq_tokens: int
    ) -> None:
        if self._token_usage is not None:
            self._token_usage.record(input_tokens, {**self._chat, n.TOKEN_TYPE: "input"})
            self._token_usage.record(output_tokens, {**self._chat, n.TOKEN_TYPE: "output"})
        self._seq_tokens.record(seq_tokens, {n.AGENT_NAME: agent})

    def admitted(self, agent: str, wait_s: float) -> None:
        self._wait.record(wait_s, {n.AGENT_NAME: agent})

    def active(self, agent: str, delta: int) -> None:
        self._active.add(delta, {n.AGENT_NAME: agent})

    def blocks(self, *, in_use: int, free: int) -> None:
        self._in_use.set(in_use, self._engine)
        self._free.set(free, self._engine)

    def preempted(self, count: int) -> None:
        self._preemptions.add(count, self._engine)
