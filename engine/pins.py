"""``PinRegistry``: the pinned prefixes of one block pool.

A pin keeps its blocks in the pool (never evicted) until it is removed, and outlives the
sequence it was made from. A shared pin also records its blocks' unsalted hashes, counted
per pin: a salted request whose leading blocks hash to them reuses them, and the salt is
mixed into its chain only after them (``engine.prefix_hash``). Single-threaded, as the
block manager that owns it.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.block import KVCacheBlock
from engine.block_pool import BlockPool
from engine.block_results import PinnedPrefix
from engine.block_table import BlockTable
from engine.errors import InvalidRequestError, SequenceStateError, UnknownPinError
from engine.prefix_hash import hash_blocks, root_hash
from engine.validation import require_int

__all__ = ["PinRegistry"]


class PinRegistry:
    def __init__(self, pool: BlockPool) -> None:
        self._pool = pool
        self._blocks: dict[int, list[KVCacheBlock]] = {}
        self._shared: dict[int, list[bytes]] = {}  # a shared pin's unsalted block hashes
        self._shared_hashes: dict[bytes, int] = {}  # how many shared pins hold each hash
        self._next_id = 0

    def add(self, blocks: list[KVCacheBlock], shared_hashes: Sequence[bytes] = ()) -> int:
        """Pin ``blocks`` in the pool; ``shared_hashes``, for a shared pin, are their
        unsalted hashes. Returns the pin's id."""
        for block in blocks:
            self._pool.pin(block)
        pin_id = self._next_id
        self._next_id += 1
        self._blocks[pin_id] = blocks
        if shared_hashes:
            self._shared[pin_id] = list(shared_hashes)
            for block_hash in shared_hashes:
                self._shared_hashes[block_hash] = self._shared_hashes.get(block_hash, 0) + 1
        return pin_id

    def pin_table(
        self, table: BlockTable, num_tokens: int | None, *, shared: bool, block_size: int
    ) -> PinnedPrefix:
        """Pin the computed full blocks of a resident sequence's first ``num_tokens``
        tokens (all of them for ``None``); a shared pin needs an unsalted sequence."""
        if shared and (table.cache_salt is not None or table.extra):
            raise InvalidRequestError(
                f"a shared pin is hashed unsalted: allocate sequence {table.seq_id!r} with no "
                "cache_salt and no extra keys"
            )
        num_tokens = table.num_tokens if num_tokens is None else num_tokens
        require_int("num_tokens", num_tokens, minimum=0)
        num_full = min(num_tokens, table.num_tokens) // block_size
        if num_full == 0:
            raise InvalidRequestError(
                f"a pinned prefix needs at least one full block of {block_size} tokens"
            )
        if num_full > table.num_cached_blocks:
            raise SequenceStateError(
                table.seq_id,
                f"computed up to block {table.num_cached_blocks}",
                f"pin {num_full} block(s) of",
                "call mark_computed() once its K/V is written",
            )
        blocks = table.blocks[:num_full]
        pin_id = self.add(blocks, table.block_hashes[:num_full] if shared else ())
        return PinnedPrefix(
            pin_id=pin_id,
            block_ids=tuple(b.block_id for b in blocks),
            num_tokens=num_full * block_size,
            shared=shared,
        )

    def remove(self, pin_id: int) -> None:
        blocks = self._blocks.pop(pin_id, None)
        if blocks is None:
            raise UnknownPinError(pin_id)
        for block_hash in self._shared.pop(pin_id, ()):
            left = self._shared_hashes.pop(block_hash) - 1
            if left:
                self._shared_hashes[block_hash] = left
        for block in reversed(blocks):
            self._pool.unpin(block)

    def num_shared_blocks(self, token_ids: Sequence[int], block_size: int, *, extra: bytes) -> int:
        """How many leading full blocks of ``token_ids`` are blocks of a shared pin. Hashes
        one block when it is none (the usual case), none when no pin is shared."""
        if not self._shared_hashes:
            return 0
        parent, k = root_hash(None), 0
        for end in range(block_size, len(token_ids) + 1, block_size):
            block = token_ids[end - block_size : end]
            (parent,) = hash_blocks(block, block_size, parent=parent, extra=extra)
            if parent not in self._shared_hashes:
                break
            k += 1
        return k
