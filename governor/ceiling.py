"""The ceiling protocol: what happens when an agent's next call would exceed its ceiling.

The governor owns the protocol; implementations live in policies/ (``RaiseAtCeiling``,
``DropOldest`` and ``SummarizeOldest``). Every compaction is a ``CompactionEvent``: what
was done, the prompt's tokens and messages before and after, and how many messages were
dropped or folded into a summary, so that each decision is explicit and can be logged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from governor.tokens import TokenCounter

__all__ = ["CeilingPolicy", "CompactionEvent"]


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
