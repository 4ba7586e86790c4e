"""The free list: a doubly linked list threaded through preallocated blocks.

Allocation pops the head; a freed block with no cached content goes to the head (it is
reused first), a freed block that still holds cached content goes to the tail. So the
head side holds the least recently used cached blocks and eviction is least recently
used first. A prefix-cache hit on a free block takes it out of the middle in O(1),
which is why the list is doubly linked rather than a Python list or deque.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from engine.block import KVCacheBlock

__all__ = ["FreeBlockQueue"]


class FreeBlockQueue:
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
        nxt = block.next_free  # type: ignore[union-attr]
        head.next_free = nxt
        nxt.prev_free = head  # type: ignore[union-attr]
        block.prev_free = block.next_free = None  # type: ignore[union-attr]
        self.num_free_blocks -= 1
        return block  # type: ignore[return-value]

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
        last.next_free = block  # type: ignore[union-attr]
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
        first.prev_free = block  # type: ignore[union-attr]
        self.num_free_blocks += 1

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self._head.next_free
        while block is not self._tail:
            assert block is not None
            yield block
            block = block.next_free
