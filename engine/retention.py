"""Retained contexts: an idle agent's K/V, kept per budget between its calls.

An agent's call finishes and it waits on a tool; its next call starts with the same
context plus the tool's result. Left alone, that context's blocks sit in the prefix
cache, first in line for eviction once they are the least recently used. ``retain``
holds the cached full blocks of the budget's latest finished request (no copy, no
compute), so the next call hits them for certain. Under pressure, ``offload`` moves a
retained context to host memory, freeing its device blocks (they stay cached until
something else needs them), and ``restore`` brings it back into the prefix cache before
the next call; a context dropped instead is recomputed through whatever the prefix
cache still holds. The next request of the budget takes the blocks over once it is
allocated, and the hold ends.

Holds are not charged to the budget: they are bounded by the context the budget's own
request just held, and a charge would be counted twice when the next request reuses them.
Holds never outrank a request: when a running request is short of blocks, or requests
wait and none can be scheduled, a resident hold gives way (``reclaim``: one no queued
request takes over first, else the one whose request runs last; offloaded to host when
there is room, else ended) before any running request is preempted, and the engine
tries again.
Either shows in the engine's metrics (fewer blocks in use, more swapped) and in
``states`` and the count ``num_reclaimed`` (``EngineMetrics.num_holds_reclaimed``: how the
governor learns of it); the budget's next request restores an offloaded context itself.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from engine.block_manager import BlockManager
from engine.block_table import SequenceState
from engine.errors import OutOfSwapSpaceError
from engine.kv_cache import KVCache

__all__ = ["Context", "RetainedContexts"]


@dataclass(frozen=True, slots=True)
class Context:
    """A budget's latest finished context: what ``retain`` holds, and what its next
    request's prompt is compared with (recompute counted, hashes reused)."""

    token_ids: tuple[int, ...]
    cache_salt: str | None
    num_shared_blocks: int  # the request's own k: a hold hashes its blocks as it did
    hashes: tuple[bytes, ...] = ()  # of its leading full blocks, as it computed them


class RetainedContexts:
    """The engine's record of each budget's latest context and the ones held."""

    __slots__ = ("_held", "_latest", "kv_cache", "manager", "num_reclaimed")

    def __init__(self, manager: BlockManager, kv_cache: KVCache) -> None:
        self.manager = manager
        self.kv_cache = kv_cache
        self._latest: dict[str, Context] = {}
        self._held: dict[str, None] = {}  # in the order held: the oldest first
        self.num_reclaimed = 0  # holds ``reclaim`` moved or ended, since the start

    def record(
        self,
        budget: str,
        token_ids: Sequence[int],
        cache_salt: str | None,
        num_shared_blocks: int = 0,
        hashes: Sequence[bytes] = (),
    ) -> None:
        """The budget's latest request finished with these tokens (prompt and output);
        ``hashes``: of their leading full blocks, where the request computed them."""
        self._latest[budget] = Context(
            tuple(token_ids), cache_salt, num_shared_blocks, tuple(hashes)
        )

    def latest(self, budget: str) -> Context | None:
        """The budget's latest finished context."""
        return self._latest.get(budget)

    def retain(self, budget: str) -> int:
        """Hold the cached blocks of the budget's latest context; the tokens held."""
        self.release(budget)
        context = self._latest.get(budget)
        if context is None:
            return 0
        num_tokens = self.manager.hold_cached(
            _seq_id(budget),
            context.token_ids,
            cache_salt=context.cache_salt,
            num_shared_blocks=context.num_shared_blocks,
            known=context.hashes,
            checked=True,  # a request's tokens, which the engine validated
        )
        if num_tokens:
            self._held[budget] = None
        return num_tokens

    def num_tokens(self, budget: str) -> int:
        return self.manager.num_tokens(_seq_id(budget)) if budget in self._held else 0

    def is_offloaded(self, budget: str) -> bool:
        return (
            budget in self._held
            and self.manager.sequence_state(_seq_id(budget)) is SequenceState.SWAPPED
        )

    def num_host_blocks_needed(self, budget: str) -> int:
        """Host blocks ``offload`` needs for the held context (0 when none is resident)."""
        if budget not in self._held or self.is_offloaded(budget):
            return 0
        return len(self.manager.block_ids(_seq_id(budget)))

    def offload(self, budget: str) -> None:
        """Move the held context to host memory (a no-op when none is resident)."""
        if budget not in self._held or self.is_offloaded(budget):
            return
        seq_id = _seq_id(budget)
        fit = self.manager.can_swap_out(seq_id)
        if not fit:
            raise OutOfSwapSpaceError(fit.needed, fit.available)
        self.kv_cache.swap_out(self.manager.swap_out(seq_id))

    def can_restore(self, budget: str) -> bool:
        """Whether ``restore`` would bring the context back now (or it is not on the host)."""
        return not self.is_offloaded(budget) or bool(self.manager.can_swap_in(_seq_id(budget)))

    def restore(self, budget: str) -> bool:
        """Bring an offloaded context back into the prefix cache when the device has room;
        False when it must stay on the host for now."""
        if not self.is_offloaded(budget):
            return True
        if not self.can_restore(budget):
            return False
        self.kv_cache.swap_in(self.manager.swap_in(_seq_id(budget)))
        return True

    def release(self, budget: str) -> None:
        """End the hold: resident blocks stay in the prefix cache, host copies are freed."""
        if budget in self._held:
            del self._held[budget]
            self.manager.free(_seq_id(budget))

    def forget(self, budget: str) -> None:
        """The budget is closed: release its hold and its latest context."""
        self.release(budget)
        self._latest.pop(budget, None)

    def held_budgets(self) -> frozenset[str]:
        return frozenset(self._held)

    def states(self) -> dict[str, bool]:
        """Each hold, budget -> whether it is on the host (offloaded) now."""
        return {budget: self.is_offloaded(budget) for budget in self._held}

    def held_seq_id(self, budget: str) -> Hashable | None:
        """The block manager's id for the budget's held context; None when none is held."""
        return _seq_id(budget) if budget in self._held else None

    def reclaim(self, *, queued: Sequence[str] = (), end: str | None = None) -> str | None:
        """Free the device blocks of one hold still on the device, for a request short of
        blocks: offload it when the host has room (its context comes back with the
        budget's next request), else end it (its blocks stay cached, evictable).

        ``queued``: the budgets whose next request waits, in scheduling order (their holds
        are about to be taken over). Holds of other budgets go first, the oldest first;
        then those whose request runs last. ``end``: a budget whose hold is ended rather
        than offloaded, the stalled queue head's own: offloaded, its request would wait for
        it and, being first in line, bring it straight back into the room it lacked (a
        livelock); ended, its blocks stay cached and its request reuses what still
        matches. The budget, or None when none is resident."""
        resident = [budget for budget in self._held if not self.is_offloaded(budget)]
        if not resident:
            return None
        rank = {budget: i for i, budget in enumerate(queued)}
        budget = min(resident, key=lambda b: (b in rank, -rank.get(b, 0)))  # stable: oldest
        seq_id = _seq_id(budget)
        if budget != end and self.manager.can_swap_out(seq_id):
            self.kv_cache.swap_out(self.manager.swap_out(seq_id))
        else:
            self.release(budget)
        self.num_reclaimed += 1
        return budget


def _seq_id(budget: str) -> tuple[str, str]:
    return ("retained", budget)
