"""The free list: a doubly linked list threaded through preallocated blocks.

Allocation pops the head; a freed block with no cached content goes to the head (it is
reused first), a freed block that still holds cached content goes to the tail. So the
head side holds the least recently used cached blocks and eviction is least recently
used first. A prefix-cache hit on a free block takes it out of the middle in O(1),
which is why the list is doubly linked rather than a Python list or deque.
``take_run``, ``extend`` and ``extendleft`` move a whole sequence's blocks in one call:
a call per block costs about as much as the relinking itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from engine.block import KVCacheBlock

__all__ = ["FreeBlockQueue"]


class FreeBlockQueue:
    # A block in the list has a prev_free and a next_free (the sentinels end it), but the
    # type says "| None": the ignores marked "linked" keep asserts off this hot path.
    __slots__ = ("_head", "_tail", "num_free_blocks")

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        # Sentinels make every insert and remove branch-free; they are never handed out.
        self._head = KVCacheBlock(block_id=-1)
        self._tail = KVCacheBlock(block_id=-1)
        prev = self._head
        for block in blocks:
            prev.next_free = block
            block.prev_free = prev
            prev = block
        prev.next_free = self._tail
        self._tail.prev_free = prev
        self.num_free_blocks = len(blocks)

    def __len__(self) -> int:
        return self.num_free_blocks

    def peek(self) -> KVCacheBlock:
        assert self.num_free_blocks > 0, "peek on an empty free queue"
        block = self._head.next_free
        assert block is not None
        return block

    def popleft(self) -> KVCacheBlock:
        assert self.num_free_blocks > 0, "popleft on an empty free queue"
        head = self._head
        block = head.next_free
        nxt = block.next_free  # type: ignore[union-attr]  # linked
        head.next_free = nxt
        nxt.prev_free = head  # type: ignore[union-attr]  # linked
        block.prev_free = block.next_free = None  # type: ignore[union-attr]  # linked
        self.num_free_blocks -= 1
        return block  # type: ignore[return-value]  # linked

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None, f"block {block.block_id} is not free"
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        tail = self._tail
        last = tail.prev_free
        last.next_free = block  # type: ignore[union-attr]  # linked
        block.prev_free = last
        block.next_free = tail
        tail.prev_free = block
        self.num_free_blocks += 1

    def appendleft(self, block: KVCacheBlock) -> None:
        head = self._head
        first = head.next_free
        head.next_free = block
        block.prev_free = head
        block.next_free = first
        first.prev_free = block  # type: ignore[union-attr]  # linked
        self.num_free_blocks += 1

    def take_run(
        self, num_blocks: int, after: KVCacheBlock | None, blocks: Sequence[KVCacheBlock]
    ) -> list[KVCacheBlock]:
        """``num_blocks`` blocks, each the block with the id after the previous one's
        (``after`` for the first) when that block is in the queue and holds no cached content,
        else the head: what ``BlockPool.allocate_after`` does one at a time, in one call.
        ``blocks`` are every block by id. The caller checks there are enough."""
        assert num_blocks <= self.num_free_blocks, "take_run past the free blocks"
        head, limit = self._head, len(blocks)
        out: list[KVCacheBlock] = []
        nxt = limit if after is None else after.block_id + 1
        for _ in range(num_blocks):
            block = blocks[nxt] if nxt < limit else None
            if block is None or block.prev_free is None or block.block_hash is not None:
                block = head.next_free
            prev, succ = block.prev_free, block.next_free  # type: ignore[union-attr]  # linked
            prev.next_free = succ  # type: ignore[union-attr]  # linked
            succ.prev_free = prev  # type: ignore[union-attr]  # linked
            block.prev_free = block.next_free = None  # type: ignore[union-attr]  # linked
            out.append(block)  # type: ignore[arg-type]  # linked
            nxt = block.block_id + 1  # type: ignore[union-attr]  # linked
        self.num_free_blocks -= num_blocks
        return out

    def extend(self, blocks: Sequence[KVCacheBlock]) -> None:
        """``append`` each block in order."""
        if not blocks:
            return
        tail = self._tail
        prev = tail.prev_free
        for block in blocks:
            prev.next_free = block  # type: ignore[union-attr]  # linked
            block.prev_free = prev
            prev = block
        prev.next_free = tail  # type: ignore[union-attr]  # linked
        tail.prev_free = prev
        self.num_free_blocks += len(blocks)

    def extendleft(self, blocks: Sequence[KVCacheBlock]) -> None:
        """``appendleft`` each block in order (the last one ends up at the head)."""
        if not blocks:
            return
        head = self._head
        succ = head.next_free
        for block in blocks:
            succ.prev_free = block  # type: ignore[union-attr]  # linked
            block.next_free = succ
            succ = block
        head.next_free = succ
        succ.prev_free = head  # type: ignore[union-attr]  # linked
        self.num_free_blocks += len(blocks)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self._head.next_free
        while block is not self._tail:
            assert block is not None
            yield block
            block = block.next_free
