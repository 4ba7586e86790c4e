"""The strictest ceiling policy: never compact, refuse the call instead.

``RaiseAtCeiling`` returns the messages unchanged when they fit with the reply's reserve
and otherwise raises ``CeilingExceeded``, so the caller decides: compact by hand, end the
agent, or ask for more with ``lease.grow()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from governor import CeilingExceeded, CompactionEvent, TokenCounter
from policies._conversation import Compaction

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
        run = Compaction.start(
            messages, ceiling_tokens=ceiling_tokens, reserve_tokens=reserve_tokens, counter=counter
        )
        if not run.fits:
            raise CeilingExceeded(self._agent, run.before + reserve_tokens, ceiling_tokens)
        return run.unchanged()
