"""``ToolCall``: what ``Governor.tool_call`` returns, around running one tool.

    with governor.tool_call(lease, "run_tests", {"path": "tests/"}) as call:
        output = run_tests("tests/")
    result = call.reduce(output)  # fits the agent's tool_output_tokens

While the block runs the lease is idle: parked after ``park_after_s``, its KV held for
up to ``retain_s`` and offloaded under pressure (``governor.idle``). The same object
works with ``async with``. ``reduce`` may be called inside or after the block.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from governor.lease import Lease
from governor.tool_output import ToolOutputReduction

if TYPE_CHECKING:
    from governor.governor import Governor

__all__ = ["ToolCall"]


class ToolCall:
    __slots__ = ("_started", "arguments", "expected_s", "governor", "lease", "tool")

    def __init__(
        self,
        governor: Governor,
        lease: Lease,
        tool: str,
        arguments: Mapping[str, Any] | None,
        *,
        expected_s: float | None,
    ) -> None:
        self.governor = governor
        self.lease = lease
        self.tool = tool
        self.arguments = arguments
        self.expected_s = expected_s
        self._started = 0.0

    def __repr__(self) -> str:
        return f"<ToolCall {self.tool!r} of lease {self.lease.lease_id}>"

    def reduce(self, output: str) -> ToolOutputReduction:
        """The tool's output fitted to the agent's ``tool_output_tokens``."""
        return self.governor.reduce_tool_output(
            self.lease, output, tool=self.tool, arguments=self.arguments
        )

    def __enter__(self) -> ToolCall:
        self._started = time.perf_counter()
        self.governor._tool_started(self.lease, self.tool, self.expected_s)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.governor._tool_ended(self.lease, self._started, exc)

    async def __aenter__(self) -> ToolCall:
        if self.governor._tool_needs_backend(self.lease):
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
        self.governor._tool_ended(self.lease, self._started, exc)
