from __future__ import annotations

from engine.block import KVCacheBlock
from engine.free_block_queue import FreeBlockQueue


def _blocks(n: int) -> list[KVCacheBlock]:
    return [KVCacheBlock(block_id=i) for i in range(n)]


def _ids(queue: FreeBlockQueue) -> list[int]:
    return [block.block_id for block in queue]


def test_new_queue_holds_the_blocks_in_order() -> None:
    queue = FreeBlockQueue(_blocks(4))
    assert len(queue) == 4
    assert _ids(queue) == [0, 1, 2, 3]


def test_empty_queue_has_no_blocks() -> None:
    queue = FreeBlockQueue([])
    assert len(queue) == 0
    assert list(queue) == []


def test_iteration_yields_the_preallocated_blocks_themselves() -> None:
    blocks = _blocks(3)
    queue = FreeBlockQueue(blocks)
    assert all(got is want for got, want in zip(queue, blocks, strict=True))


def test_iteration_does_not_consume_the_queue() -> None:
    queue = FreeBlockQueue(_blocks(3))
    assert _ids(queue) == _ids(queue) == [0, 1, 2]
    assert len(queue) == 3


def test_popleft_takes_blocks_from_the_head_in_order() -> None:
    queue = FreeBlockQueue(_blocks(4))
    assert [queue.popleft().block_id for _ in range(4)] == [0, 1, 2, 3]
    assert len(queue) == 0
    assert list(queue) == []


def test_popleft_returns_the_same_object_and_unlinks_it() -> None:
    blocks = _blocks(2)
    queue = FreeBlockQueue(blocks)
    block = queue.popleft()
    assert block is blocks[0]
    assert block.prev_free is None
    assert block.next_free is None


def test_peek_returns_the_head_without_removing_it() -> None:
    blocks = _blocks(2)
    queue = FreeBlockQueue(blocks)
    assert queue.peek() is blocks[0]
    assert len(queue) == 2
    assert _ids(queue) == [0, 1]


def test_append_puts_a_block_at_the_tail() -> None:
    blocks = _blocks(3)
    queue = FreeBlockQueue(blocks[:2])
    queue.append(blocks[2])
    assert _ids(queue) == [0, 1, 2]
    assert len(queue) == 3


def test_appendleft_puts_a_block_at_the_head() -> None:
    blocks = _blocks(3)
    queue = FreeBlockQueue(blocks[1:])
    queue.appendleft(blocks[0])
    assert _ids(queue) == [0, 1, 2]
    assert queue.popleft() is blocks[0]


def test_append_and_appendleft_on_an_empty_queue() -> None:
    blocks = _blocks(2)
    queue = FreeBlockQueue([])
    queue.append(blocks[1])
    queue.appendleft(blocks[0])
    assert _ids(queue) == [0, 1]
    assert len(queue) == 2


def test_remove_from_the_middle() -> None:
    blocks = _blocks(4)
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[1])
    assert _ids(queue) == [0, 2, 3]
    assert len(queue) == 3
    assert blocks[1].prev_free is None
    assert blocks[1].next_free is None


def test_remove_the_head() -> None:
    blocks = _blocks(3)
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[0])
    assert _ids(queue) == [1, 2]
    assert queue.popleft() is blocks[1]


def test_remove_the_tail() -> None:
    blocks = _blocks(3)
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])
    assert _ids(queue) == [0, 1]
    queue.append(blocks[2])
    assert _ids(queue) == [0, 1, 2]


def test_remove_the_only_block_leaves_a_usable_empty_queue() -> None:
    blocks = _blocks(1)
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[0])
    assert len(queue) == 0
    assert list(queue) == []
    queue.append(blocks[0])
    assert queue.popleft() is blocks[0]


def test_a_removed_block_can_be_put_back() -> None:
    blocks = _blocks(4)
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[1])
    queue.append(blocks[1])
    assert _ids(queue) == [0, 2, 3, 1]


def test_len_follows_every_operation() -> None:
    blocks = _blocks(4)
    queue = FreeBlockQueue(blocks)
    queue.popleft()
    assert len(queue) == 3
    queue.remove(blocks[2])
    assert len(queue) == 2
    queue.append(blocks[2])
    assert len(queue) == 3
    queue.appendleft(blocks[0])
    assert len(queue) == 4
    assert len(queue) == queue.num_free_blocks == len(list(queue))


def test_operations_only_ever_hand_out_the_original_blocks() -> None:
    blocks = _blocks(5)
    originals = {id(block) for block in blocks}
    queue = FreeBlockQueue(blocks)
    taken = [queue.popleft(), queue.popleft()]
    queue.remove(blocks[3])
    queue.appendleft(taken[1])
    queue.append(blocks[3])
    queue.append(taken[0])
    assert _ids(queue) == [1, 2, 4, 3, 0]
    assert {id(block) for block in queue} == originals
    drained = [queue.popleft() for _ in range(len(queue))]
    assert all(block is blocks[block.block_id] for block in drained)


def test_take_run_follows_ids_while_the_next_one_is_free_and_uncached() -> None:
    blocks = _blocks(8)
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[0])  # in use
    queue.remove(blocks[2])  # in use
    queue.remove(blocks[4])
    blocks[4].block_hash = b"h"  # cached, so at the tail: [1, 3, 5, 6, 7, 4]
    queue.append(blocks[4])
    taken = queue.take_run(4, blocks[2], blocks)
    # 3 follows 2; 4 is cached so the head (1) comes next; 2 is in use so the head (5);
    # then 6 follows 5.
    assert [b.block_id for b in taken] == [3, 1, 5, 6]
    assert _ids(queue) == [7, 4]
    assert len(queue) == 2
    assert all(b.prev_free is None and b.next_free is None for b in taken)


def test_extend_and_extendleft_match_append_and_appendleft_one_by_one() -> None:
    one, batch = _blocks(6), _blocks(6)
    q_one, q_batch = FreeBlockQueue(one[:2]), FreeBlockQueue(batch[:2])
    for block in one[2:4]:
        q_one.append(block)
    for block in one[4:]:
        q_one.appendleft(block)
    q_batch.extend(batch[2:4])
    q_batch.extendleft(batch[4:])
    q_batch.extend([])
    assert _ids(q_one) == _ids(q_batch) == [5, 4, 0, 1, 2, 3]
    assert len(q_one) == len(q_batch) == 6
