"""What happens within a traced lease: model calls, tools, compaction, summarization and
held KV, as spans and span events under its agent span (``integrations.otel``).

``CallEvents`` is mixed into ``Instrumentation``, as ``ModelCalls`` is into ``Governor``:
the attributes it declares are the instrumentation's. A lease's calls and tools are
matched to their ends in order (the events carry no call id): the oldest open call
ends at ``call.finished``, the oldest open tool of that name at ``tool.finished``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AnyValue

from governor import CompactionEvent, GovernorEvent, ToolOutputReduction
from integrations.otel import names as n
from integrations.otel._metrics import GovernorMetrics

__all__ = ["CallEvents", "LeaseSpans", "ns"]


def ns(seconds: float) -> int:
    """A ``GovernorEvent.at`` (seconds since the epoch) as OpenTelemetry nanoseconds."""
    return int(seconds * 1e9)


@dataclass(slots=True, eq=False)
class LeaseSpans:
    """One traced lease: its agent span, the call and tool spans open under it, totals."""

    span: Span
    agent: str
    run_id: str | None
    ceiling: int
    calls: deque[Span] = field(default_factory=deque)
    tools: list[tuple[str | None, Span]] = field(default_factory=list)
    admitted: bool = False
    active: bool = False
    num_admissions: int = 0
    wait_s: float = 0.0
    num_parked: int = 0
    num_offloads: int = 0
    offloaded_blocks: int = 0
    num_compactions: int = 0
    compaction_saved: int = 0
    num_summarizations: int = 0
    summarize_saved: int = 0
    max_seq_tokens: int = 0
    num_calls: int = 0
    ended: bool = False
    # Orders this span's events before its end: a timer may park a lease as it is released.
    span_lock: threading.Lock = field(default_factory=threading.Lock)

    def add_event(self, name: str, attributes: dict[str, Any], at: float) -> None:
        with self.span_lock:
            if not self.ended:
                self.span.add_event(name, attributes, timestamp=ns(at))

    def end(self, attributes: dict[str, Any], end_time: int | None) -> None:
        with self.span_lock:
            if not self.ended:
                self.ended = True
                self.span.set_attributes(attributes)
                self.span.end(end_time=end_time)

    def totals(self) -> dict[str, Any]:
        """The agent span's attributes when it ends."""
        return {
            n.CEILING: self.ceiling,
            n.WAIT_S: self.wait_s,
            n.NUM_ADMISSIONS: self.num_admissions,
            n.PARKED: self.num_parked,
            n.OFFLOADED: self.num_offloads,
            n.OFFLOADED_BLOCKS: self.offloaded_blocks,
            n.COMPACTIONS: self.num_compactions,
            n.COMPACTION_SAVED: self.compaction_saved,
            n.SUMMARIZATIONS: self.num_summarizations,
            n.SUMMARIZE_SAVED: self.summarize_saved,
            n.SEQ_TOKENS: self.max_seq_tokens,
            n.NUM_CALLS: self.num_calls,
        }


class CallEvents:
    """Handlers for the events inside a lease; ``Instrumentation`` provides the rest."""

    model_spans: bool
    tool_spans: bool
    _lock: threading.Lock
    _leases: dict[str, LeaseSpans]
    _closed: bool
    _metrics: GovernorMetrics
    _common: dict[str, str]
    _pressure: threading.local
    _start: Callable[[str, Span | None, SpanKind, dict[str, Any], float], Span]
    _lease: Callable[[GovernorEvent], LeaseSpans | None]
    _poll: Callable[[tuple[LeaseSpans, float] | None], None]

    # -- model calls ------------------------------------------------------------------
    def _call_started(self, event: GovernorEvent) -> None:
        state = self._lease(event)
        if state is None or not self.model_spans:
            return
        model = self._common[n.REQUEST_MODEL]
        attributes = {
            n.OPERATION: "chat",
            **self._common,
            n.AGENT_NAME: state.agent,
            n.LEASE_ID: str(event.lease_id),
            n.CEILING: state.ceiling,
            n.REQUEST_MAX_TOKENS: int(event.attributes.get("max_tokens", 0)),
        }
        span = self._start(f"chat {model}", state.span, SpanKind.CLIENT, attributes, event.at)
        if not self._adopt(event, state, lambda: state.calls.append(span)):
            span.end()

    def _call_finished(self, event: GovernorEvent) -> None:
        a = event.attributes
        prompt, completion = int(a["prompt_tokens"]), int(a["completion_tokens"])
        seq_tokens = int(a["tokens_in_context"])
        with self._lock:
            state = self._leases.get(str(event.lease_id))
            if state is None:
                return
            state.max_seq_tokens = max(state.max_seq_tokens, seq_tokens)
            state.num_calls += 1
            span = state.calls.popleft() if state.calls else None
        attributes: dict[str, Any] = {
            n.INPUT_TOKENS: prompt,
            n.OUTPUT_TOKENS: completion,
            n.CACHE_READ_TOKENS: int(a["cached_tokens"]),
            n.CACHED_TOKENS: int(a["cached_tokens"]),
            n.FINISH_REASONS: (str(a["finish_reason"]),),
            n.FINISH_REASON: str(a["finish_reason"]),
            n.SEQ_TOKENS: seq_tokens,
            n.BLOCKS_HELD: int(a["blocks_held"]),
            n.CEILING: state.ceiling,
            n.ELAPSED_S: float(a["elapsed_s"]),
        }
        self._metrics.call_finished(
            state.agent, input_tokens=prompt, output_tokens=completion, seq_tokens=seq_tokens
        )
        if span is not None:
            span.set_attributes(attributes)
            span.end(end_time=ns(event.at))
        elif not self.model_spans:  # another instrumentation draws the chat span
            state.add_event(n.EVENT_CALL, attributes, event.at)
        self._poll((state, event.at))  # its preemptions go on this span

    def _call_failed(self, event: GovernorEvent) -> None:
        error = str(event.attributes.get("error", "error"))
        with self._lock:
            state = self._leases.get(str(event.lease_id))
            span = state.calls.popleft() if state is not None and state.calls else None
        if state is None:
            return
        attributes: dict[str, AnyValue] = {
            n.ERROR_TYPE: error,
            n.ELAPSED_S: float(event.attributes.get("elapsed_s", 0)),
        }
        if span is None:
            if not self.model_spans:
                state.add_event(n.EVENT_CALL, attributes, event.at)
            return
        span.set_attributes(attributes)
        span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=ns(event.at))

    # -- tools --------------------------------------------------------------------------
    def _tool_started(self, event: GovernorEvent) -> None:
        state = self._lease(event)
        if state is None or not self.tool_spans:
            return
        tool = event.attributes.get("tool")
        attributes = {
            n.OPERATION: "execute_tool",
            n.TOOL_NAME: str(tool),
            n.AGENT_NAME: state.agent,
            n.LEASE_ID: str(event.lease_id),
        }
        span = self._start(
            f"execute_tool {tool}", state.span, SpanKind.INTERNAL, attributes, event.at
        )
        if not self._adopt(event, state, lambda: state.tools.append((tool, span))):
            span.end()

    def _tool_finished(self, event: GovernorEvent) -> None:
        tool = event.attributes.get("tool")
        span = self._pop_tool(event, tool)
        if span is None:
            return
        error = event.attributes.get("error")
        if error is not None:
            span.set_attribute(n.ERROR_TYPE, str(error))
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end(end_time=ns(event.at))

    def _pop_tool(self, event: GovernorEvent, tool: object) -> Span | None:
        with self._lock:
            state = self._leases.get(str(event.lease_id))
            if state is None:
                return None
            for i, (name, span) in enumerate(state.tools):
                if name == tool:
                    del state.tools[i]
                    return span
            return None

    # -- what the policies did ------------------------------------------------------------
    def _compacted(self, event: GovernorEvent) -> None:
        record = event.record
        if not isinstance(record, CompactionEvent):
            return
        with self._lock:
            state = self._leases.get(str(event.lease_id))
            if state is None:
                return
            state.num_compactions += 1
            state.compaction_saved += record.tokens_saved
        attributes = {
            n.METHOD: record.method,
            n.TOKENS_BEFORE: record.tokens_before,
            n.TOKENS_AFTER: record.tokens_after,
            n.TOKENS_SAVED: record.tokens_saved,
            "kvgov.messages_before": record.messages_before,
            "kvgov.messages_after": record.messages_after,
            "kvgov.messages_dropped": record.dropped,
            "kvgov.messages_summarized": record.summarized,
        }
        state.add_event(n.EVENT_COMPACTED, attributes, event.at)

    def _summarized(self, event: GovernorEvent) -> None:
        record = event.record
        if not isinstance(record, ToolOutputReduction):
            return
        tool = event.attributes.get("tool")
        with self._lock:
            state = self._leases.get(str(event.lease_id))
            if state is None:
                return
            state.num_summarizations += 1
            state.summarize_saved += record.tokens_saved
            open_tool = next((span for name, span in state.tools if name == tool), None)
        attributes: dict[str, AnyValue] = {
            n.METHOD: record.method,
            n.TOKENS_BEFORE: record.tokens_before,
            n.TOKENS_AFTER: record.tokens_after,
            n.TOKENS_SAVED: record.tokens_saved,
        }
        if record.detail:  # e.g. why an LLM summary fell back to the extractive one
            attributes[n.DETAIL] = record.detail
        if tool is not None:
            attributes[n.TOOL_NAME] = str(tool)
        if open_tool is None:  # reduced after the tool returned
            state.add_event(n.EVENT_SUMMARIZED, attributes, event.at)
        else:
            open_tool.add_event(n.EVENT_SUMMARIZED, attributes, timestamp=ns(event.at))

    # -- held KV ---------------------------------------------------------------------------
    def _pressure_seen(self, event: GovernorEvent) -> None:
        """Pressure is published on the thread that then offloads: remember it there."""
        a = event.attributes
        self._pressure.last = {
            n.PRESSURE_IN_USE: int(a.get("blocks_in_use", 0)),
            n.PRESSURE_NUM_BLOCKS: int(a.get("num_blocks", 0)),
            n.PRESSURE_NEEDED: int(a.get("blocks_needed", 0)),
        }

    def _held_kv(self, event: GovernorEvent) -> None:
        a = event.attributes
        blocks = int(a.get("blocks", 0))
        with self._lock:
            state = self._leases.get(str(event.lease_id))
            if state is None:
                return
            if event.kind == "offloaded":
                state.num_offloads += 1
                state.offloaded_blocks += blocks
        attributes: dict[str, Any] = (
            {n.TOKENS: int(a.get("tokens", 0))} if event.kind == "retained" else {n.BLOCKS: blocks}
        )
        if "reason" in a:
            attributes[n.REASON] = str(a["reason"])
        if event.kind in ("offloaded", "dropped"):
            attributes.update(getattr(self._pressure, "last", None) or {})
        name = {
            "retained": n.EVENT_RETAINED,
            "offloaded": n.EVENT_OFFLOADED,
            "dropped": n.EVENT_DROPPED,
            "restored": n.EVENT_RESTORED,
        }[event.kind]
        state.add_event(name, attributes, event.at)

    def _adopt(self, event: GovernorEvent, state: LeaseSpans, add: Callable[[], None]) -> bool:
        """Keep a new call or tool span on its lease, unless the lease ended meanwhile."""
        with self._lock:
            if self._closed or self._leases.get(str(event.lease_id)) is not state:
                return False
            add()
            return True
