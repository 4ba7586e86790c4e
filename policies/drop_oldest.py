"""Compaction by forgetting: drop the oldest turns until the conversation fits.

``DropOldest`` keeps every system message, the first user message and the latest turns
(at most ``keep_last_turns``, fewer while they do not fit, never fewer than one), and
drops whole turns from the oldest. A turn starts at a user message; when even the latest
turn does not fit (an agent loop answering one user message), the loop's rounds are
dropped from the oldest instead. An assistant message that calls tools is kept or
dropped together with its tool results, so a result is never separated from its call.
Nothing is marked in the text; the event counts what was dropped. When even the head and
the last round do not fit it raises ``CeilingExceeded``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from governor import CeilingExceeded, CompactionEvent, TokenCounter
from policies._conversation import Compaction, check_setting, pick, splits

__all__ = ["DropOldest"]


class DropOldest:
    """A ``CeilingPolicy`` that keeps the head and as many of the latest turns as fit."""

    def __init__(self, keep_last_turns: int = 4, *, agent: str = "agent") -> None:
        check_setting("keep_last_turns", keep_last_turns, 1)
        self._keep = keep_last_turns
        self._agent = agent

    def __repr__(self) -> str:
        return f"DropOldest(keep_last_turns={self._keep}, agent={self._agent!r})"

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
        if run.fits:
            return run.unchanged()
        room = run.room
        tokens = run.before
        for parts in splits(messages):  # whole turns first, then an agent loop's rounds
            for k in range(min(self._keep, len(parts.turns)), 0, -1):
                indexes = parts.head + [i for turn in parts.turns[-k:] for i in turn]
                kept = pick(messages, indexes)
                tokens = counter.count_messages(kept)
                if tokens <= room:
                    return kept, run.event("drop_oldest", kept, tokens)
        raise CeilingExceeded(self._agent, tokens + reserve_tokens, ceiling_tokens)
