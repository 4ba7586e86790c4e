"""OpenTelemetry for the governor: spans, span events and metrics from its event stream.

    handle = instrument(governor, tracer_provider=provider, meter_provider=meters)
    ...
    handle.uninstrument()  # or: with instrument(governor): ...

``instrument`` subscribes to the governor's ``GovernorEvent`` stream and draws:

    invoke_workflow {run}       a ``governor.run(name)``: run.started to run.finished
      invoke_agent {agent}      a lease: requested to released
        chat {model}            a model call: call.started to call.finished or failed
        execute_tool {tool}     a ``governor.tool_call``
        invoke_agent {child}    a child lease, under its parent lease's agent span

An agent span's parent is its parent lease's agent span, else its run's span, else the
OpenTelemetry context current where the lease was requested (subscribers run on the
requesting thread). Spans carry the GenAI attributes and ``kvgov.*`` memory attributes
(``integrations.otel.names``); an agent span gets its totals when it ends: ceiling,
admission wait, times parked and offloaded, compactions and summarizations with the
tokens they saved, and the most tokens it held in context. Span events record each
admission and resume, parking, compaction and summarization (tokens before and
after), retention, offload, drop and restore of held KV (with the pressure that caused
an offload), and engine preemptions (``backend.metrics().num_preemptions``, polled
after each model call: the engine does not say whose sequence it preempted, so the
event goes on the agent span whose call saw it). The backend is read on the calling
thread only where that thread runs no event loop; an async agent's events have it read
on a sampler thread instead (``integrations.otel._sampler``), so telemetry never makes
an event loop wait for an engine step; a preemption found there after the asking
lease's span ended is counted in the metric only. Failed calls and tools, runs that
raise, and agents whose work raised, was cancelled or was never admitted get status
ERROR and ``error.type``. The run span records the KV budget (blocks, block size, bytes
per block, safety factor) so ``kvgov report`` can size from it. Metrics: see
``integrations.otel._metrics``.

Beside another GenAI instrumentation (LangChain's, an HTTP client's) that makes its
own ``chat`` spans and token-usage metric, pass ``model_spans=False``: each model call
is then a ``kvgov.call`` event on its agent span with the same ``kvgov.*`` attributes,
and ``gen_ai.client.token.usage`` is left to the other instrumentation, so nothing is
counted twice. ``tool_spans=False`` does the same for ``execute_tool``.

Events arrive from many threads at once; the state below is guarded by one lock, and
spans are started and ended outside it. Telemetry never breaks the agents: a failure
while handling an event is logged and dropped. Every span ends: at release, at the end
of its run for a lease that was never admitted (its waiter timed out or was
cancelled), and at ``uninstrument`` for whatever is still open. Leases requested
before ``instrument`` are not traced.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import MeterProvider, get_meter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from governor import BackendMetrics, ConfigError, Governor, GovernorEvent, __version__
from integrations.otel import names as n
from integrations.otel._calls import CallEvents, LeaseSpans, ns
from integrations.otel._metrics import GovernorMetrics
from integrations.otel._sampler import BackendSampler

__all__ = ["Instrumentation", "instrument"]

_log = logging.getLogger(__name__)
_SCOPE = "kvgov"


def instrument(
    governor: Governor,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    model_spans: bool = True,
    tool_spans: bool = True,
) -> Instrumentation:
    """Trace and measure ``governor`` until the handle's ``uninstrument()``; the global
    providers are used where none is given."""
    if not isinstance(governor, Governor):
        raise ConfigError(
            f"instrument() takes a governor.Governor, got {type(governor).__name__}",
            setting="governor",
        )
    backend = governor.backend
    metrics = GovernorMetrics(
        get_meter(_SCOPE, __version__, meter_provider),
        provider=backend.name,
        model=backend.model,
        token_usage=model_spans,
    )
    tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider)
    return Instrumentation(
        governor, tracer, metrics, model_spans=model_spans, tool_spans=tool_spans
    )


class Instrumentation(CallEvents):
    """What ``instrument`` returns. ``uninstrument()`` (idempotent; also on leaving a
    ``with`` block) unsubscribes and ends every span still open."""

    def __init__(
        self,
        governor: Governor,
        tracer: trace.Tracer,
        metrics: GovernorMetrics,
        *,
        model_spans: bool,
        tool_spans: bool,
    ) -> None:
        self.governor = governor
        self.model_spans = model_spans
        self.tool_spans = tool_spans
        self._tracer = tracer
        self._metrics = metrics
        self._lock = threading.Lock()
        self._runs: dict[str, Span] = {}
        self._leases: dict[str, LeaseSpans] = {}
        self._closed = False
        self._preemptions: int | None = None  # the engine's count at the first reading
        self._pressure = threading.local()  # the pressure an offload on this thread answers
        self._common = {n.PROVIDER: governor.backend.name, n.REQUEST_MODEL: governor.backend.model}
        self._handlers = {
            "run.started": self._run_started,
            "run.finished": self._run_finished,
            "requested": self._requested,
            "admitted": self._admitted,
            "resumed": self._admitted,
            "parked": self._parked,
            "released": self._released,
            "call.started": self._call_started,
            "call.finished": self._call_finished,
            "call.failed": self._call_failed,
            "tool.started": self._tool_started,
            "tool.finished": self._tool_finished,
            "compacted": self._compacted,
            "summarized": self._summarized,
            "retained": self._held_kv,
            "offloaded": self._held_kv,
            "dropped": self._held_kv,
            "restored": self._held_kv,
            "pressure": self._pressure_seen,
        }
        self._sampler: BackendSampler[tuple[LeaseSpans, float]] = BackendSampler(
            governor.backend, self._sampled
        )
        self._sampler.poll()  # the baseline: the engine's preemptions so far are not this run's
        self._sampler.capacity()  # what a run span started on an event loop will show
        self._unsubscribe = governor.subscribe(self._on_event)

    def __repr__(self) -> str:
        state = "uninstrumented" if self._closed else f"{len(self._leases)} leases open"
        return f"<Instrumentation of {self.governor.backend.model!r}: {state}>"

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstrument()

    def span_for(self, *, lease_id: str | None = None, run_id: str | None = None) -> Span | None:
        """The open agent span of a lease (or span of a run), to nest other spans under:
        ``with trace.use_span(handle.span_for(lease_id=lease.lease_id)): ...``."""
        with self._lock:
            if lease_id is not None:
                state = self._leases.get(lease_id)
                return None if state is None else state.span
            return None if run_id is None else self._runs.get(run_id)

    def uninstrument(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            leases, runs = list(self._leases.values()), list(self._runs.values())
            self._leases.clear()
            self._runs.clear()
            active = [state.active for state in leases]
            for state in leases:
                state.active = False
        self._unsubscribe()
        self._sampler.close()  # the last reading lands before the spans end
        for state, was_active in zip(leases, active, strict=True):
            self._end_lease(state, None, was_active=was_active, ended_by="uninstrument")
        for span in runs:
            span.set_attribute(n.ENDED_BY, "uninstrument")
            span.end()

    # -- dispatch -------------------------------------------------------------------
    def _on_event(self, event: GovernorEvent) -> None:
        handler = self._handlers.get(event.kind)
        if handler is None or self._closed:
            return
        try:
            handler(event)
        except Exception:  # telemetry must never break the agents
            _log.exception("kvgov telemetry could not record a %r event", event.kind)

    def _start(
        self, name: str, parent: Span | None, kind: SpanKind, attributes: dict[str, Any], at: float
    ) -> Span:
        context = (
            otel_context.get_current() if parent is None else trace.set_span_in_context(parent)
        )
        return self._tracer.start_span(
            name, context=context, kind=kind, attributes=attributes, start_time=ns(at)
        )

    def _lease(self, event: GovernorEvent) -> LeaseSpans | None:
        with self._lock:
            return None if event.lease_id is None else self._leases.get(event.lease_id)

    # -- runs -----------------------------------------------------------------------
    def _run_started(self, event: GovernorEvent) -> None:
        name = str(event.attributes.get("name", "run"))
        parent_run = event.attributes.get("parent_run_id")
        with self._lock:
            parent = None if parent_run is None else self._runs.get(str(parent_run))
        attributes = {
            n.OPERATION: "invoke_workflow",
            n.WORKFLOW_NAME: name,
            n.RUN_ID: str(event.run_id),
            **self._common,
            **self._budget(),
        }
        if parent_run is not None:
            attributes[n.RUN_PARENT_ID] = str(parent_run)
        span = self._start(
            f"invoke_workflow {name}", parent, SpanKind.INTERNAL, attributes, event.at
        )
        with self._lock:
            if not self._closed and event.run_id is not None:
                self._runs[event.run_id] = span
                return
        span.end()

    def _run_finished(self, event: GovernorEvent) -> None:
        with self._lock:
            span = self._runs.pop(str(event.run_id), None)
            waiting = [
                (lease_id, state)
                for lease_id, state in self._leases.items()
                if state.run_id == event.run_id and not state.admitted
            ]
            for lease_id, _ in waiting:
                del self._leases[lease_id]
        for _, state in waiting:  # never admitted: its waiter timed out or was cancelled
            state.span.set_attribute(n.ERROR_TYPE, "never admitted")
            state.span.set_status(Status(StatusCode.ERROR, "never admitted"))
            self._end_lease(state, event.at, was_active=False, ended_by="run end")
        if span is None:
            return
        error = event.attributes.get("error")
        if error is not None:
            span.set_attribute(n.ERROR_TYPE, str(error))
            span.set_status(Status(StatusCode.ERROR, str(error)))
        self._poll()
        span.end(end_time=ns(event.at))

    def _budget(self) -> dict[str, Any]:
        capacity = self._sampler.capacity()
        if capacity is None:  # a backend that cannot say: the run is traced without it
            return {}
        return {
            n.NUM_BLOCKS: capacity.num_blocks,
            n.NUM_AVAILABLE_BLOCKS: capacity.num_available_blocks,
            n.BLOCK_SIZE: capacity.block_size,
            n.BYTES_PER_BLOCK: capacity.bytes_per_block,
            n.SAFETY_FACTOR: float(self.governor.config.safety_factor),
            n.ADMISSION_MODE: self.governor.config.mode.value,
        }

    # -- leases ---------------------------------------------------------------------
    def _requested(self, event: GovernorEvent) -> None:
        parent_id = event.attributes.get("parent_id")
        with self._lock:
            parent_lease = None if parent_id is None else self._leases.get(str(parent_id))
            run = None if event.run_id is None else self._runs.get(event.run_id)
        agent = event.agent or "agent"
        ceiling = int(event.attributes.get("ceiling_tokens", 0))
        attributes: dict[str, Any] = {
            n.OPERATION: "invoke_agent",
            n.AGENT_NAME: agent,
            **self._common,
            n.LEASE_ID: str(event.lease_id),
            n.CEILING: ceiling,
            n.PRIORITY: int(event.attributes.get("priority", 0)),
        }
        optional = {
            n.PARENT_LEASE_ID: parent_id,
            n.PREFIX_BLOCKS: event.attributes.get("prefix_blocks") or None,
            n.TENANT: event.tenant,
            n.RUN_ID: event.run_id,
            n.TOOL_OUTPUT_TOKENS: getattr(
                self.governor.agents.get(agent), "tool_output_tokens", None
            ),
        }
        attributes.update({k: v for k, v in optional.items() if v is not None})
        parent = parent_lease.span if parent_lease is not None else run
        span = self._start(f"invoke_agent {agent}", parent, SpanKind.INTERNAL, attributes, event.at)
        with self._lock:
            if not self._closed and event.lease_id is not None:
                self._leases[event.lease_id] = LeaseSpans(span, agent, event.run_id, ceiling)
                return
        span.end()

    def _admitted(self, event: GovernorEvent) -> None:
        wait_s = float(event.attributes.get("wait_s", 0.0))
        with self._lock:
            state = None if event.lease_id is None else self._leases.get(event.lease_id)
            if state is None:
                return
            state.admitted = True
            state.num_admissions += 1
            state.wait_s += wait_s
            state.ceiling = int(event.attributes.get("ceiling_tokens", state.ceiling))
            became_active, state.active = not state.active, True
        name = n.EVENT_RESUMED if event.kind == "resumed" else n.EVENT_ADMITTED
        state.add_event(name, {n.WAIT_S: wait_s, n.CEILING: state.ceiling}, event.at)
        self._metrics.admitted(state.agent, wait_s)
        if became_active:
            self._metrics.active(state.agent, +1)

    def _parked(self, event: GovernorEvent) -> None:
        with self._lock:
            state = None if event.lease_id is None else self._leases.get(event.lease_id)
            if state is None:
                return
            state.num_parked += 1
            was_active, state.active = state.active, False
        reason = str(event.attributes.get("reason", "manual"))
        state.add_event(n.EVENT_PARKED, {n.REASON: reason}, event.at)
        if was_active:
            self._metrics.active(state.agent, -1)

    def _released(self, event: GovernorEvent) -> None:
        with self._lock:
            state = None if event.lease_id is None else self._leases.pop(event.lease_id, None)
            if state is None:
                return
            tokens = int(event.attributes.get("tokens_in_context", 0))
            state.max_seq_tokens = max(state.max_seq_tokens, tokens)
            state.num_calls = int(event.attributes.get("num_calls", state.num_calls))
            was_active, state.active = state.active, False
        error = event.attributes.get("error")
        if error is not None:  # the agent's work ended in a failure or was cancelled
            state.span.set_attribute(n.ERROR_TYPE, str(error))
            state.span.set_status(Status(StatusCode.ERROR, str(error)))
        self._poll()
        self._end_lease(state, event.at, was_active=was_active)

    def _end_lease(
        self, state: LeaseSpans, at: float | None, *, was_active: bool, ended_by: str | None = None
    ) -> None:
        end_time = None if at is None else ns(at)
        with self._lock:
            open_spans = [*state.calls, *(span for _, span in state.tools)]
            state.calls.clear()
            state.tools.clear()
            totals = state.totals()
        for span in open_spans:  # a call or tool still running when its lease ended
            span.set_attribute(n.ENDED_BY, ended_by or "release")
            span.end(end_time=end_time)
        if ended_by is not None:
            totals[n.ENDED_BY] = ended_by
        if was_active:
            self._metrics.active(state.agent, -1)
        state.end(totals, end_time)

    def _poll(self, asker: tuple[LeaseSpans, float] | None = None) -> None:
        """Read the engine's metrics (``_sampled`` records them); ``asker``: the lease and
        time of the call whose end asked, for the preemptions the reading finds."""
        self._sampler.poll(asker)

    def _sampled(self, m: BackendMetrics, askers: list[tuple[LeaseSpans, float]]) -> None:
        """Set the block gauges; count new preemptions, on the span of the latest call that
        asked (none for the first reading: the baseline)."""
        self._metrics.blocks(in_use=m.num_blocks_in_use, free=m.num_blocks_free)
        with self._lock:
            if self._preemptions is None:
                self._preemptions = m.num_preemptions
                return
            new = max(0, m.num_preemptions - self._preemptions)
            self._preemptions += new
        if not new:
            return
        self._metrics.preempted(new)
        if askers:
            state, at = askers[-1]
            state.add_event(n.EVENT_PREEMPTED, {n.PREEMPTIONS: new}, at)
