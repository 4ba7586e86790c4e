"""``ToolCall``: what ``Governor.tool_call`` returns, around running one tool.

    with governor.tool_call(lease, "run_tests", {"path": "tests/"}) as call:
        output = run_tests("tests/")
    result = call.reduce(output)  # fits the agent's tool_output_tokens

While the block runs the lease is idle: parked after ``park_after_s``, its KV held for
up to ``retain_s`` and offloaded under pressure (``governor.idle``). The same object
works with ``async with``. ``reduce`` may be called inside or after the block.
``ToolCalls`` makes and serves them, with the lease's idle period kept by the
``LeaseLifecycle``.

``ToolDurations`` keeps each tool's history (Continuum's per-tool durations), for a tool
call made without ``expected_s``:

- its mean is when the call is expected back, for the pressure policy's choices;
- its median over the last calls decides whether its KV is worth holding: a tool whose
  calls more often than not outlast ``retain_s`` is not held for (the hold would only
  keep device blocks from other agents, then end), while one slow call among quick ones
  (heavy-tailed latencies) does not stop the holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from governor.clock import Clock
from governor.config import finite_number
from governor.errors import ConfigError, LeaseReleased
from governor.events import LeaseEvents, error_name
from governor.lease import Lease, LeaseState
from governor.lifecycle import LeaseLifecycle
from governor.tokens import TokenCounter
from governor.tool_durations import ToolDurations
from governor.tool_output import ToolOutputPolicy, ToolOutputReduction, reduce_output

__all__ = ["ToolCall", "ToolCalls"]


class ToolCalls:
    def __init__(
        self,
        *,
        lifecycle: LeaseLifecycle,
        durations: ToolDurations,
        output_policy: ToolOutputPolicy,
        counter: TokenCounter,
        events: LeaseEvents,
        clock: Clock,
    ) -> None:
        self.lifecycle = lifecycle
        self.durations = durations
        self.output_policy = output_policy
        self.counter = counter
        self.events = events
        self.clock = clock

    def tool_call(
        self,
        lease: Lease,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        expected_s: float | None = None,
        question: str | None = None,
    ) -> ToolCall:
        """Serves ``Governor.tool_call``, where its contract is written."""
        if lease.state is LeaseState.RELEASED:
            raise LeaseReleased(lease.lease_id, agent=lease.agent.name)
        if expected_s is not None and not (finite_number(expected_s) and expected_s >= 0):
            raise ConfigError(
                f"expected_s must be the seconds the tool is expected to run (>= 0) or None "
                f"when unknown, got {expected_s!r}",
                setting="expected_s",
            )
        return ToolCall(self, lease, tool, arguments, expected_s=expected_s, question=question)

    def needs_backend(self, lease: Lease) -> bool:
        """Whether a tool starting now calls the backend (to hold the lease's KV)."""
        return self.lifecycle.tool_calls_backend(lease)

    def started(self, lease: Lease, tool: str, expected_s: float | None) -> None:
        lease.tool = tool
        expected = self.durations.mean(tool) if expected_s is None else expected_s
        lease.tool_started_at, lease.tool_expected_s = self.clock.now(), expected
        self.events.publish("tool.started", lease, tool=tool)
        typical = self.durations.median(tool) if expected_s is None else expected_s
        self.lifecycle.begin_tool(lease, expected_s=typical)

    def ended(self, lease: Lease, started: float, error: BaseException | None) -> None:
        tool, lease.tool = lease.tool, None
        lease.tool_started_at = lease.tool_expected_s = None
        self.lifecycle.end_tool(lease)
        elapsed_s = self.clock.now() - started
        if error is None and tool is not None:
            self.durations.record(tool, elapsed_s)
        self.events.publish(
            "tool.finished", lease, tool=tool, elapsed_s=elapsed_s, error=error_name(error)
        )

    def reduce_tool_output(
        self,
        lease: Lease,
        text: str,
        *,
        tool: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        question: str | None = None,
    ) -> ToolOutputReduction:
        """Serves ``Governor.reduce_tool_output``, where its contract is written."""
        budget = lease.agent.tool_output_tokens
        if budget is None:
            tokens = self.counter.count(text)
            return ToolOutputReduction(text, tokens, tokens, "none", 0.0)
        reduction = reduce_output(
            self.output_policy,
            text,
            budget_tokens=budget,
            tool_name=tool,
            arguments=arguments,
            question=question,
        )
        if reduction.changed:
            lease.tokens_summarized += reduction.tokens_saved
            self.events.publish("summarized", lease, record=reduction, tool=tool)
        return reduction


class ToolCall:
    __slots__ = ("_calls", "_started", "arguments", "expected_s", "lease", "question", "tool")

    def __init__(
        self,
        calls: ToolCalls,
        lease: Lease,
        tool: str,
        arguments: Mapping[str, Any] | None,
        *,
        expected_s: float | None,
        question: str | None = None,
    ) -> None:
        self._calls = calls
        self.lease = lease
        self.tool = tool
        self.arguments = arguments
        self.expected_s = expected_s
        self.question = question
        self._started = 0.0

    def __repr__(self) -> str:
        return f"<ToolCall {self.tool!r} of lease {self.lease.lease_id}>"

    def reduce(self, output: str) -> ToolOutputReduction:
        """The tool's output fitted to the agent's ``tool_output_tokens``."""
        return self._calls.reduce_tool_output(
            self.lease, output, tool=self.tool, arguments=self.arguments, question=self.question
        )

    def __enter__(self) -> ToolCall:
        self._started = self._calls.clock.now()
        self._calls.started(self.lease, self.tool, self.expected_s)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._calls.ended(self.lease, self._started, exc)

    async def __aenter__(self) -> ToolCall:
        if self._calls.needs_backend(self.lease):
            # Holding its KV calls the backend (an engine round trip): off the event loop.
            await asyncio.to_thread(self.__enter__)
            return self
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._calls.ended(self.lease, self._started, exc)
