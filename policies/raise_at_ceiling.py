"""The strictest ceiling policy: never compact, refuse the call instead.

``RaiseAtCeiling`` returns the messages unchanged when they fit with the reply's reserve
and otherwise raises ``CeilingExceeded``, so the caller decides: compact by hand, end the
agent, or ask for more with ``lease.grow()``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from governor import CeilingExceeded, CompactionEvent, TokenCounter
from policies._conversation import check_limits

__all__ = ["RaiseAtCeiling"]


class RaiseAtCeiling:
    """A ``CeilingPolicy`` that raises ``CeilingExceeded`` for agent ``agent`` when over."""

    def __init__(self, *, agent: str = "agent") -> None:
        self._agent = agent

    def __repr__(self) -> str:
        return f"RaiseAtCeiling(agent={self._agent!r})"

    def compact(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        ceiling_tokens: int,
        reserve_tokens: int,
        counter: TokenCounter,
    ) -> tuple[list[dict[str, Any]], CompactionEvent]:
        check_limits(ceiling_tokens, reserve_tokens)
        started = time.perf_counter()
        tokens = counter.count_messages(messages)
        if tokens + reserve_tokens > ceiling_tokens:
            raise CeilingExceeded(self._agent, tokens + reserve_tokens, ceiling_tokens)
        event = CompactionEvent(
            method="none",
            tokens_before=tokens,
            tokens_after=tokens,
            messages_before=len(messages),
            messages_after=len(messages),
            dropped=0,
            summarized=0,
            elapsed_s=time.perf_counter() - started,
        )
        return [dict(message) for message in messages], event
