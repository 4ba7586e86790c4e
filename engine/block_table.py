"""A sequence's token ids and its block table (logical block i -> physical block)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum

from engine.block import KVCacheBlock
from engine.block_pool import BlockPool
from engine.budget import Budget
from engine.prefix_hash import hash_chain

__all__ = ["BlockTable", "SequenceState"]


class SequenceState(Enum):
    RESIDENT = "resident"  # blocks on the device
    SWAPPED = "swapped"  # blocks in host swap space


@dataclass(slots=True, eq=False)
class BlockTable:
    """Owned by ``BlockManager``; callers read it through the manager.

    ``blocks`` holds device blocks while resident and host blocks while swapped, so its
    length is always ``ceil(num_tokens / block_size)``. ``block_hashes[i]`` is the chained
    hash of full block ``i``: the prompt's from its look-up at allocation (its full
    blocks before the last token), the rest made as they are computed; only the first
    ``num_cached_blocks`` were offered to the prefix cache. The first
    ``num_shared_blocks`` hash unsalted (a shared pin's), the rest with ``cache_salt``
    (``engine.prefix_hash.hash_chain``).
    """

    seq_id: Hashable
    token_ids: list[int]
    blocks: list[KVCacheBlock] = field(default_factory=list)
    state: SequenceState = SequenceState.RESIDENT
    ceiling_tokens: int | None = None
    budget: Budget | None = None
    cache_salt: str | None = None
    num_shared_blocks: int = 0
    extra: bytes = b""
    block_hashes: list[bytes] = field(default_factory=list)
    num_cached_blocks: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def block_ids(self) -> list[int]:
        return [block.block_id for block in self.blocks]

    def cache_computed(self, pool: BlockPool, num_full: int, block_size: int) -> None:
        """Offer the first ``num_full`` blocks, now computed, to the prefix cache. A block
        whose content another block already caches is swapped for that one (same K/V),
        so every holder shares it and can pin it."""
        hashes = self.block_hashes
        if num_full > len(hashes):
            hashes += hash_chain(
                self.token_ids[: num_full * block_size],
                block_size,
                cache_salt=self.cache_salt,
                num_shared_blocks=self.num_shared_blocks,
                extra=self.extra,
                start_block=len(hashes),
                previous=hashes[-1] if hashes else None,
            )
        for i in range(self.num_cached_blocks, num_full):
            block, canonical = self.blocks[i], pool.lookup(hashes[i])
            if canonical is None:
                pool.cache(block, hashes[i])
            elif canonical is not block:  # equal prompts admitted together computed it twice
                pool.touch(canonical)
                self.blocks[i] = canonical
                pool.free(block)
        self.num_cached_blocks = max(self.num_cached_blocks, num_full)
