"""Typed results of the block manager's checks and operations."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum

from engine.block import KVCacheBlock
from engine.budget import Budget
from engine.errors import (
    BudgetExceededError,
    CapacityError,
    CeilingExceededError,
    OutOfBlocksError,
    OutOfSwapSpaceError,
)

__all__ = [
    "Allocation",
    "AllocationPlan",
    "AppendResult",
    "BlockMove",
    "BlockStats",
    "Fit",
    "PinnedPrefix",
    "Shortfall",
    "refusal",
]

BlockMove = tuple[int, int]  # (src block id, dst block id)


class Shortfall(Enum):
    POOL = "pool"
    HOST_POOL = "host_pool"
    BUDGET = "budget"
    CEILING = "ceiling"


@dataclass(frozen=True, slots=True)
class Fit:
    """The answer of a ``can_*`` check: truthy when it fits, else what ran short."""

    shortfall: Shortfall | None = None
    needed: int = 0
    available: int = 0

    def __bool__(self) -> bool:
        return self.shortfall is None


@dataclass(frozen=True, slots=True)
class Allocation:
    block_ids: tuple[int, ...]
    num_cached_tokens: int  # leading tokens whose K/V came from the prefix cache


@dataclass(frozen=True, slots=True)
class AppendResult:
    new_block_ids: tuple[int, ...]
    copies: tuple[BlockMove, ...]  # copy on write: perform before writing the new tokens


@dataclass(frozen=True, slots=True)
class PinnedPrefix:
    pin_id: int
    block_ids: tuple[int, ...]
    num_tokens: int
    shared: bool = False  # hashed unsalted: every tenant's requests that start with it hit it


@dataclass(frozen=True, slots=True)
class BlockStats:
    num_blocks: int
    num_empty: int
    num_cached: int
    num_in_use: int
    num_pinned: int
    num_host_blocks: int
    num_swapped: int
    num_sequences: int
    num_tokens: int
    num_allocated_slots: int
    prefix_cache_queries: int  # tokens looked up by allocate
    prefix_cache_hits: int  # of those, tokens served from the cache

    @property
    def fragmentation_tokens(self) -> int:
        """Allocated token slots that hold no live token (internal fragmentation)."""
        return self.num_allocated_slots - self.num_tokens

    @property
    def num_free(self) -> int:
        return self.num_empty + self.num_cached


def refusal(
    fit: Fit, seq_id: Hashable, budget: Budget | None, ceiling_tokens: int | None
) -> CapacityError:
    """The typed error that matches a failed check, to raise from the acting call."""
    if fit.shortfall is Shortfall.CEILING:
        assert ceiling_tokens is not None
        return CeilingExceededError(seq_id, fit.needed, ceiling_tokens)
    if fit.shortfall is Shortfall.BUDGET:
        assert budget is not None
        return BudgetExceededError(budget.name, fit.needed, fit.available, budget.max_blocks)
    if fit.shortfall is Shortfall.HOST_POOL:
        return OutOfSwapSpaceError(fit.needed, fit.available)
    assert fit.shortfall is Shortfall.POOL
    return OutOfBlocksError(fit.needed, fit.available)


@dataclass(frozen=True, slots=True)
class AllocationPlan:
    """What ``BlockManager.allocate`` checked before acting: whether it fits, the cached
    blocks its prompt reuses, and the hashes of its full blocks."""

    fit: Fit
    hits: list[KVCacheBlock]
    hashes: list[bytes]
    extra: bytes = b""
