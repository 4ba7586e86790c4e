"""The ceiling protocol: what happens when an agent's next call would exceed its ceiling.

The governor owns the protocol and ships the strictest policy as its default,
``RaiseAtCeiling`` (never compact; refuse the call); the compacting ones live in
policies/ (``DropOldest`` and ``SummarizeOldest``). Every compaction is a ``CompactionEvent``: what
was done, the prompt's tokens and messages before and after, and how many messages were
dropped or folded into a summary, so that each decision is explicit and can be logged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from governor.clock import SYSTEM_CLOCK, Clock
from governor.errors import CeilingExceeded, ConfigError
from governor.tokens import TokenCounter

__all__ = ["CeilingPolicy", "CompactionEvent", "RaiseAtCeiling"]


@dataclass(frozen=True, slots=True)
class CompactionEvent:
    """One compaction and its record.

    ``method`` names what was done (``"none"`` when the messages already fit);
    ``tokens_before`` and ``tokens_after`` are ``counter.count_messages`` of the prompt
    before and after, without the reply's reserve; ``dropped`` counts the input messages
    that are gone from the result and ``summarized`` those of them folded into a summary.
    """

    method: str
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int
    dropped: int
    summarized: int
    elapsed_s: float

    @property
    def tokens_saved(self) -> int:
        return self.tokens_before - self.tokens_after

    @property
    def changed(self) -> bool:
        return self.method != "none"


@runtime_checkable
class CeilingPolicy(Protocol):
    """Compacts a conversation whose next call would exceed ``ceiling_tokens``.

    Returns new messages (the input is never modified) whose
    ``counter.count_messages`` plus ``reserve_tokens`` (room for the reply) is at most
    ``ceiling_tokens``, and the event that records it, or raises ``CeilingExceeded``
    when the policy cannot or will not make them fit.
    """

    def compact(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        ceiling_tokens: int,
        reserve_tokens: int,
        counter: TokenCounter,
    ) -> tuple[list[dict[str, Any]], CompactionEvent]: ...


class RaiseAtCeiling:
    """The governor's default ``CeilingPolicy``: never compact. Messages that fit with the
    reply's reserve come back unchanged; otherwise ``CeilingExceeded`` for ``agent``, so
    the caller decides: compact, end the agent, or ask for more with ``lease.grow()``.
    ``clock`` times the check (``CompactionEvent.elapsed_s``): the governor's."""

    def __init__(self, *, agent: str = "agent", clock: Clock = SYSTEM_CLOCK) -> None:
        self._agent = agent
        self._clock = clock

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
        started = self._clock.now()
        for setting, value, minimum in (
            ("ceiling_tokens", ceiling_tokens, 1),
            ("reserve_tokens", reserve_tokens, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ConfigError.below_minimum(setting, value, minimum)
        tokens = counter.count_messages(messages)
        if tokens + reserve_tokens > ceiling_tokens:
            raise CeilingExceeded(self._agent, tokens + reserve_tokens, ceiling_tokens)
        kept = [dict(message) for message in messages]
        n = len(kept)
        return kept, CompactionEvent(
            method="none",
            tokens_before=tokens,
            tokens_after=tokens,
            messages_before=n,
            messages_after=n,
            dropped=0,
            summarized=0,
            elapsed_s=self._clock.now() - started,
        )
