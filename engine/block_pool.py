"""The pool of physical blocks: allocation, reference counts, the prefix cache, pins.

Plain Python on the hot path: ``allocate`` and ``free`` touch a handful of slots on
preallocated ``KVCacheBlock`` objects and create no Python object. Every block is in
exactly one of three conditions at any time:

- in use:  ``ref_cnt > 0`` (held by block tables and/or pins);
- cached:  free, but still the prefix cache's entry for its hash (evictable);
- empty:   free, no cached content.

``num_empty + num_cached + num_in_use == num_blocks`` always holds. The same class
serves as the host swap pool with caching off.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.block import KVCacheBlock
from engine.errors import DoubleFreeError, InvalidRequestError, PinnedBlockError
from engine.free_block_queue import FreeBlockQueue

__all__ = ["BlockPool"]

_MAX_GAPS = 64  # a fragmented 200k-block pool: ~60 us a call, not a full scan
_BEFORE_FIRST = KVCacheBlock(block_id=-1)  # "after" this, a run starts at block 0


class BlockPool:
    __slots__ = (
        "_empty",
        "_free_queue",
        "blocks",
        "cached",
        "enable_caching",
        "num_blocks",
        "num_cached",
        "num_pinned",
        "num_room_changes",
    )

    def __init__(self, *, num_blocks: int, enable_caching: bool = True) -> None:
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 0:
            raise InvalidRequestError(f"num_blocks must be a non-negative int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
        self._free_queue = FreeBlockQueue(self.blocks)
        # 1 where a block is empty (free, no cached content), by id: where runs can start.
        self._empty = bytearray(b"\x01") * num_blocks
        self.cached: dict[bytes, KVCacheBlock] = {}  # hash -> its one canonical block
        self.num_cached = 0  # free blocks that still hold cached content
        self.num_pinned = 0  # blocks with at least one pin
        # Bumped whenever a block returns to the free queue or content enters the cache:
        # between two bumps a check for room that failed still fails (allocations and
        # touches only take free blocks and hits away), so it need not be made again.
        self.num_room_changes = 0

    # -- counts ---------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: empty plus evictable cached blocks."""
        return self._free_queue.num_free_blocks

    @property
    def num_empty(self) -> int:
        return self._free_queue.num_free_blocks - self.num_cached

    @property
    def num_in_use(self) -> int:
        return self.num_blocks - self._free_queue.num_free_blocks

    # -- allocate / free ------------------------------------------------------------
    def allocate(self) -> KVCacheBlock:
        """Take one free block (empty first, then the least recently used cached one).

        The caller checks ``num_free_blocks`` first; an empty pool here is a bug.
        """
        block = self._free_queue.popleft()
        if block.block_hash is not None:
            self._evict(block)
        self._empty[block.block_id] = 0
        block.ref_cnt = 1
        return block

    def allocate_after(self, prev: KVCacheBlock | None) -> KVCacheBlock:
        """Like ``allocate`` but prefer the block right after ``prev`` when it is empty.

        A sequence whose blocks sit in one contiguous run can be attended as a zero-copy
        view of the cache, so a growing sequence keeps extending its run when it can.
        Cached blocks are not taken out of turn: their content may still be reused.
        """
        if prev is not None:
            nxt_id = prev.block_id + 1
            if nxt_id < self.num_blocks:
                block = self.blocks[nxt_id]
                if block.ref_cnt == 0 and block.block_hash is None:
                    self._free_queue.remove(block)
                    self._empty[nxt_id] = 0
                    block.ref_cnt = 1
                    return block
        return self.allocate()

    def allocate_blocks(
        self, num_blocks: int, after: KVCacheBlock | None = None
    ) -> list[KVCacheBlock]:
        """``num_blocks`` blocks, as ``allocate_after`` would hand them out one by one
        starting after ``after``: a sequence's new blocks in one call, the hot path of
        admission and decode. The caller checks ``num_free_blocks`` first."""
        out = self._free_queue.take_run(num_blocks, after, self.blocks)
        cached, empty = self.cached, self._empty
        for block in out:
            empty[block.block_id] = 0
            if block.block_hash is not None:
                del cached[block.block_hash]
                block.block_hash = None
                self.num_cached -= 1
            block.ref_cnt = 1
        return out

    def is_empty(self, block_id: int) -> bool:
        """Whether ``block_id`` is a block, free and holding no cached content."""
        return 0 <= block_id < self.num_blocks and self._empty[block_id] == 1

    def run_start(self) -> KVCacheBlock | None:
        """Where a sequence that cannot extend its run should start a new one, as the
        ``after`` of ``allocate_blocks``: in the largest gap of empty blocks, at its middle
        when a block in use precedes it (that block's sequence may grow into the first
        half), else at its start. Sequences decoding side by side so split the free
        space between them and each extends one run, instead of taking the head of the
        free queue in turn and interleaving one-block runs (each a copy before attention
        reads it). ``None`` when no block is empty (the free queue's order decides).
        A scan of one byte per block, in C, only when a run ends; in a fragmented pool it
        weighs the first ``_MAX_GAPS`` gaps only, so its cost stays bounded."""
        mask, size = self._empty, self.num_blocks
        best, start, end = 0, 0, 0
        pos = mask.find(1)
        for _ in range(_MAX_GAPS):  # memchr from gap to gap
            if pos < 0:
                break
            stop = mask.find(0, pos)
            stop = size if stop < 0 else stop
            if stop - pos > best:
                best, start, end = stop - pos, pos, stop
            pos = mask.find(1, stop)
        if best == 0:
            return None
        if start > 0 and self.blocks[start - 1].ref_cnt > 0:
            start += (end - start) // 2
        return self.blocks[start - 1] if start > 0 else _BEFORE_FIRST

    def free_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """``free`` each block in order (a sequence frees its tail first); a bad free
        raises at that block, after the ones before it are freed."""
        empty: list[KVCacheBlock] = []
        cached: list[KVCacheBlock] = []
        mask = self._empty
        try:
            for block in blocks:
                ref = block.ref_cnt
                if ref <= block.num_pins:
                    self._raise_bad_free(block)
                ref -= 1
                block.ref_cnt = ref
                if ref == 0:
                    if block.block_hash is None:
                        empty.append(block)
                        mask[block.block_id] = 1  # in the free queue by the end
                    else:
                        cached.append(block)
        finally:
            self._free_queue.extendleft(empty)
            self._free_queue.extend(cached)
            self.num_cached += len(cached)
            self.num_room_changes += 1

    def free(self, block: KVCacheBlock) -> None:
        """Drop one table's reference; at zero the block joins the free queue."""
        ref = block.ref_cnt
        if ref <= block.num_pins:
            self._raise_bad_free(block)
        ref -= 1
        block.ref_cnt = ref
        if ref == 0:
            self.num_room_changes += 1
            if block.block_hash is None:
                self._free_queue.appendleft(block)
                self._empty[block.block_id] = 1
            else:
                self._free_queue.append(block)
                self.num_cached += 1

    def _raise_bad_free(self, block: KVCacheBlock) -> None:
        if block.ref_cnt == 0:
            raise DoubleFreeError(block.block_id)
        raise PinnedBlockError(block.block_id)

    def touch(self, block: KVCacheBlock) -> None:
        """Take one more reference on a block found in the prefix cache."""
        if block.ref_cnt == 0:
            self._free_queue.remove(block)
            self._empty[block.block_id] = 0
            if block.block_hash is not None:
                self.num_cached -= 1
        block.ref_cnt += 1

    # -- prefix cache ---------------------------------------------------------------
    def lookup(self, block_hash: bytes) -> KVCacheBlock | None:
        return self.cached.get(block_hash)

    def match(self, hashes: Sequence[bytes]) -> list[KVCacheBlock]:
        """The cached blocks of the longest prefix of ``hashes`` (chained hashes, so a
        miss ends the prefix)."""
        lookup = self.cached.get
        hits: list[KVCacheBlock] = []
        for block_hash in hashes:
            block = lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def cache(self, block: KVCacheBlock, block_hash: bytes) -> None:
        """Make an in-use, computed, full block reusable under ``block_hash``.

        If another block already holds that content, it stays the canonical one and this
        block remains uncached (it is freed as empty): no merging after the fact.
        """
        assert block.ref_cnt > 0, "only blocks in use are cached"
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash not in self.cached:
            self.cached[block_hash] = block
            block.block_hash = block_hash
            self.num_room_changes += 1

    def _evict(self, block: KVCacheBlock) -> None:
        # Called on a block just taken out of the free queue.
        del self.cached[block.block_hash]  # type: ignore[arg-type]  # callers check it is set
        block.block_hash = None
        self.num_cached -= 1

    def reset_cache(self) -> int:
        """Drop every evictable cached block's content; returns how many were dropped."""
        dropped = 0
        for block in self.blocks:
            if block.ref_cnt == 0 and block.block_hash is not None:
                self._free_queue.remove(block)
                self._evict(block)
                self._free_queue.appendleft(block)
                self._empty[block.block_id] = 1
                dropped += 1
        return dropped

    # -- pins -----------------------------------------------------------------------
    def pin(self, block: KVCacheBlock) -> None:
        """A pin is a reference that no table owns: the block cannot be evicted."""
        self.touch(block)
        block.num_pins += 1
        if block.num_pins == 1:
            self.num_pinned += 1

    def unpin(self, block: KVCacheBlock) -> None:
        assert block.num_pins > 0, f"block {block.block_id} is not pinned"
        block.num_pins -= 1
        if block.num_pins == 0:
            self.num_pinned -= 1
        self.free(block)
