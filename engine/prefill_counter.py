"""``PrefillCounter``: the engine's own count of prompt tokens computed, and recomputed.

A token is *prefilled* when its K/V is computed from a known token: a prompt token (a
pinned prefix's among them, computed once by ``Engine.pin_prefix``), or an output token
computed again after a preemption. The decode of a freshly sampled token is
not prefill. A prefilled token is *recomputed* when its K/V had been computed before for
the same context and was thrown away: a position the request itself computed before it
was preempted (recompute on preemption), or a position of the budget's previous request
that the new prompt repeats token for token (an agent's next call, whose context was
evicted or dropped while it waited on a tool). The previous request's last token was
sampled, never computed, so at most ``len(previous) - 1`` of its positions count.

This is what a governor of idle KV saves, counted where the compute happens: the
``kvgov bench swarm`` figures ``prefill tokens recomputed`` are these counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["PrefillCounter"]


@dataclass(slots=True)
class _Known:
    num_reusable: int  # leading positions the budget's previous request computed
    num_high: int = 0  # positions this request has computed at least once


@dataclass(slots=True)
class PrefillCounter:
    num_prefill_tokens: int = 0
    num_recomputed_tokens: int = 0
    _known: dict[str, _Known] = field(default_factory=dict)

    def arrived(
        self, request_id: str, token_ids: Sequence[int], previous: Sequence[int] | None
    ) -> int:
        """A request was queued; ``previous`` is its budget's last finished context.
        Returns how many leading tokens repeat it (at most all but its last)."""
        reusable = 0
        if previous:
            limit = min(len(token_ids), len(previous) - 1)
            reusable = _common_prefix(token_ids, previous, limit)
        self._known[request_id] = _Known(reusable)
        return reusable

    def count(
        self, request_id: str, start: int, num_tokens: int, num_prompt: int
    ) -> tuple[int, int]:
        """How many of positions ``[start, start + num_tokens)`` computing them now would
        count as prefilled, and how many of those as recomputed; (0, 0) for a request the
        counter did not see arrive. Counts nothing: ``computed`` does."""
        known = self._known.get(request_id)
        if known is None:
            return 0, 0
        end = start + num_tokens
        # Prefill: prompt positions, and output positions computed before (preemption).
        prefilled = max(0, min(end, max(num_prompt, known.num_high)) - start)
        seen = max(known.num_reusable, known.num_high)
        return prefilled, max(0, min(end, seen) - start)

    def computed(self, request_id: str, start: int, num_tokens: int, num_prompt: int) -> None:
        """Positions ``[start, start + num_tokens)`` of the request were computed."""
        known = self._known.get(request_id)
        if known is None:  # not a request the counter saw arrive
            return
        prefilled, recomputed = self.count(request_id, start, num_tokens, num_prompt)
        self.num_prefill_tokens += prefilled
        self.num_recomputed_tokens += recomputed
        known.num_high = max(known.num_high, start + num_tokens)

    def pinned(self, num_tokens: int) -> None:
        """A prefix was pinned: ``num_tokens`` of its tokens were computed (none of them
        recomputed: a pin belongs to no budget, whose earlier context it could repeat)."""
        self.num_prefill_tokens += num_tokens

    def forget(self, request_id: str) -> None:
        self._known.pop(request_id, None)


def _common_prefix(ours: Sequence[int], theirs: Sequence[int], limit: int) -> int:
    """How many of the first ``limit`` tokens the two sequences share, compared a slice
    at a time (a 16k-token context arrives at every call, and most repeat it whole)."""
    low, high = 0, limit  # ours[:low] == theirs[:low]; a difference before high, if any
    while high - low > _SCAN:
        if list(ours[low:high]) == list(theirs[low:high]):
            return high
        middle = (low + high) // 2
        if list(ours[low:middle]) == list(theirs[low:middle]):
            low = middle
        else:
            high = middle
    for position in range(low, high):
        if ours[position] != theirs[position]:
            return position
    return high


_SCAN = 64  # below this, one token at a time
