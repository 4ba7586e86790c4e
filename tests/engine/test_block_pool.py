from __future__ import annotations

import random

import pytest

from engine.block_pool import BlockPool
from engine.errors import DoubleFreeError, InvalidRequestError, PinnedBlockError

# Fake content hashes: the pool only compares them.
H0, H1, H2, H3 = (bytes([i]) * 16 for i in range(4))


def _counts(pool: BlockPool) -> tuple[int, int, int, int]:
    """(free, empty, cached, in use), after checking that they add up."""
    assert pool.num_empty + pool.num_cached + pool.num_in_use == pool.num_blocks
    assert pool.num_free_blocks == pool.num_empty + pool.num_cached
    return pool.num_free_blocks, pool.num_empty, pool.num_cached, pool.num_in_use


def _cached_free_block(pool: BlockPool, block_hash: bytes):
    block = pool.allocate()
    pool.cache(block, block_hash)
    pool.free(block)
    return block


# -- construction -------------------------------------------------------------------------
def test_a_new_pool_is_all_empty() -> None:
    pool = BlockPool(num_blocks=4)
    assert _counts(pool) == (4, 4, 0, 0)
    assert pool.num_pinned == 0
    assert [block.block_id for block in pool.blocks] == [0, 1, 2, 3]


def test_a_pool_of_zero_blocks_is_allowed() -> None:
    pool = BlockPool(num_blocks=0)
    assert _counts(pool) == (0, 0, 0, 0)


@pytest.mark.parametrize("bad", [-1, True, 2.0, "4"])
def test_num_blocks_must_be_a_non_negative_int(bad: object) -> None:
    with pytest.raises(InvalidRequestError, match="num_blocks must be a non-negative int"):
        BlockPool(num_blocks=bad)  # type: ignore[arg-type]


# -- allocate / free ----------------------------------------------------------------------
def test_allocate_hands_out_blocks_in_id_order() -> None:
    pool = BlockPool(num_blocks=4)
    assert [pool.allocate().block_id for _ in range(4)] == [0, 1, 2, 3]
    assert _counts(pool) == (0, 0, 0, 4)


def test_allocate_returns_a_preallocated_block_with_one_reference() -> None:
    pool = BlockPool(num_blocks=2)
    block = pool.allocate()
    assert block is pool.blocks[0]
    assert block.ref_cnt == 1


def test_allocate_and_free_update_the_counts() -> None:
    pool = BlockPool(num_blocks=4)
    blocks = [pool.allocate() for _ in range(3)]
    assert _counts(pool) == (1, 1, 0, 3)
    pool.free(blocks[1])
    assert _counts(pool) == (2, 2, 0, 2)
    assert blocks[1].ref_cnt == 0


def test_a_freed_empty_block_is_reused_first() -> None:
    pool = BlockPool(num_blocks=4)
    blocks = [pool.allocate() for _ in range(3)]
    pool.free(blocks[1])
    assert pool.allocate() is blocks[1]


def test_empty_blocks_are_reused_before_cached_ones() -> None:
    pool = BlockPool(num_blocks=3)
    b0, b1, b2 = (pool.allocate() for _ in range(3))
    pool.cache(b0, H0)
    pool.free(b0)
    pool.free(b1)
    pool.free(b2)
    assert _counts(pool) == (3, 2, 1, 0)
    assert [pool.allocate().block_id for _ in range(2)] == [2, 1]
    assert pool.lookup(H0) is b0
    assert pool.allocate() is b0


def test_allocating_a_cached_block_evicts_its_content() -> None:
    pool = BlockPool(num_blocks=1)
    block = _cached_free_block(pool, H0)
    assert _counts(pool) == (1, 0, 1, 0)
    assert pool.allocate() is block
    assert block.block_hash is None
    assert pool.lookup(H0) is None
    assert _counts(pool) == (0, 0, 0, 1)


def test_cached_blocks_are_evicted_least_recently_freed_first() -> None:
    pool = BlockPool(num_blocks=3)
    b0, b1, b2 = (pool.allocate() for _ in range(3))
    for block, block_hash in ((b0, H0), (b1, H1), (b2, H2)):
        pool.cache(block, block_hash)
    for block in (b1, b0, b2):
        pool.free(block)
    assert pool.allocate() is b1
    assert (pool.lookup(H0), pool.lookup(H1), pool.lookup(H2)) == (b0, None, b2)
    assert pool.allocate() is b0
    assert pool.allocate() is b2


def test_double_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(num_blocks=2)
    block = pool.allocate()
    pool.free(block)
    with pytest.raises(DoubleFreeError, match="each allocation must be freed exactly once") as err:
        pool.free(block)
    assert err.value.block_id == 0
    assert _counts(pool) == (2, 2, 0, 0)


# -- touch / prefix cache -----------------------------------------------------------------
def test_touch_revives_a_cached_free_block() -> None:
    pool = BlockPool(num_blocks=2)
    block = _cached_free_block(pool, H0)
    pool.touch(block)
    assert block.ref_cnt == 1
    assert block.block_hash == H0
    assert pool.lookup(H0) is block
    assert _counts(pool) == (1, 1, 0, 1)


def test_a_touched_block_is_no_longer_handed_out() -> None:
    pool = BlockPool(num_blocks=2)
    block = _cached_free_block(pool, H0)
    pool.touch(block)
    assert pool.allocate().block_id == 1
    assert pool.num_free_blocks == 0


def test_touch_on_a_block_in_use_adds_a_reference() -> None:
    pool = BlockPool(num_blocks=2)
    block = pool.allocate()
    pool.touch(block)
    assert block.ref_cnt == 2
    pool.free(block)
    assert _counts(pool) == (1, 1, 0, 1)
    pool.free(block)
    assert _counts(pool) == (2, 2, 0, 0)


def test_a_cached_block_in_use_stays_cached_when_freed() -> None:
    pool = BlockPool(num_blocks=2)
    block = pool.allocate()
    pool.cache(block, H0)
    assert _counts(pool) == (1, 1, 0, 1)
    pool.free(block)
    assert _counts(pool) == (2, 1, 1, 0)
    assert pool.lookup(H0) is block


def test_cache_keeps_the_first_block_for_a_duplicate_hash() -> None:
    pool = BlockPool(num_blocks=2)
    first, second = pool.allocate(), pool.allocate()
    pool.cache(first, H0)
    pool.cache(second, H0)
    assert pool.lookup(H0) is first
    assert second.block_hash is None
    pool.free(second)
    assert _counts(pool) == (1, 1, 0, 1)


def test_a_cached_block_keeps_its_first_hash() -> None:
    pool = BlockPool(num_blocks=1)
    block = pool.allocate()
    pool.cache(block, H0)
    pool.cache(block, H1)
    assert block.block_hash == H0
    assert pool.lookup(H1) is None


def test_cache_does_nothing_when_caching_is_off() -> None:
    pool = BlockPool(num_blocks=2, enable_caching=False)
    block = pool.allocate()
    pool.cache(block, H0)
    assert pool.lookup(H0) is None
    pool.free(block)
    assert _counts(pool) == (2, 2, 0, 0)


def test_match_returns_the_blocks_of_the_longest_cached_prefix() -> None:
    pool = BlockPool(num_blocks=3)
    b0, b1, b2 = (pool.allocate() for _ in range(3))
    for block, block_hash in ((b0, H0), (b1, H1), (b2, H2)):
        pool.cache(block, block_hash)
    assert pool.match([H0, H1, H3, H2]) == [b0, b1]
    assert pool.match([H3, H0]) == []
    assert pool.match([]) == []


def test_reset_cache_drops_only_free_cached_blocks() -> None:
    pool = BlockPool(num_blocks=4)
    b0, b1, b2 = (pool.allocate() for _ in range(3))
    for block, block_hash in ((b0, H0), (b1, H1), (b2, H2)):
        pool.cache(block, block_hash)
    pool.free(b0)
    pool.free(b1)
    assert pool.reset_cache() == 2
    assert _counts(pool) == (3, 3, 0, 1)
    assert (pool.lookup(H0), pool.lookup(H1), pool.lookup(H2)) == (None, None, b2)
    assert (b0.block_hash, b1.block_hash) == (None, None)


def test_reset_cache_with_nothing_cached_drops_nothing() -> None:
    pool = BlockPool(num_blocks=2)
    pool.allocate()
    assert pool.reset_cache() == 0
    assert _counts(pool) == (1, 1, 0, 1)


# -- allocate_after -----------------------------------------------------------------------
def test_allocate_after_prefers_the_adjacent_empty_block() -> None:
    pool = BlockPool(num_blocks=3)
    b0, b1, b2 = (pool.allocate() for _ in range(3))
    pool.free(b1)
    pool.free(b2)  # the head of the free queue is now block 2
    assert pool.allocate_after(b0) is b1
    assert b1.ref_cnt == 1
    assert _counts(pool) == (1, 1, 0, 2)


def test_allocate_after_falls_back_to_the_head_when_the_neighbour_is_in_use() -> None:
    pool = BlockPool(num_blocks=5)
    blocks = [pool.allocate() for _ in range(5)]
    pool.free(blocks[4])
    assert pool.allocate_after(blocks[0]) is blocks[4]


def test_allocate_after_the_last_block_falls_back_to_the_head() -> None:
    pool = BlockPool(num_blocks=3)
    blocks = [pool.allocate() for _ in range(3)]
    pool.free(blocks[0])
    assert pool.allocate_after(blocks[2]) is blocks[0]


def test_allocate_after_none_is_a_plain_allocate() -> None:
    pool = BlockPool(num_blocks=2)
    assert pool.allocate_after(None).block_id == 0


def test_allocate_after_does_not_take_an_adjacent_cached_block() -> None:
    pool = BlockPool(num_blocks=3)
    b0, b1, b2 = (pool.allocate() for _ in range(3))
    pool.cache(b1, H1)
    pool.free(b2)
    pool.free(b1)
    assert pool.allocate_after(b0) is b2
    assert pool.lookup(H1) is b1
    assert _counts(pool) == (1, 0, 1, 2)


# -- pins ---------------------------------------------------------------------------------
def test_pin_and_unpin_count_pins_and_references() -> None:
    pool = BlockPool(num_blocks=2)
    block = pool.allocate()
    pool.pin(block)
    assert (block.ref_cnt, block.num_pins, pool.num_pinned) == (2, 1, 1)
    pool.pin(block)
    assert (block.ref_cnt, block.num_pins, pool.num_pinned) == (3, 2, 1)
    pool.unpin(block)
    assert (block.ref_cnt, block.num_pins, pool.num_pinned) == (2, 1, 1)
    pool.unpin(block)
    assert (block.ref_cnt, block.num_pins, pool.num_pinned) == (1, 0, 0)


def test_pinned_blocks_are_counted_once_each() -> None:
    pool = BlockPool(num_blocks=3)
    b0, b1 = pool.allocate(), pool.allocate()
    pool.pin(b0)
    pool.pin(b1)
    pool.pin(b1)
    assert pool.num_pinned == 2


def test_freeing_a_reference_that_only_pins_hold_raises() -> None:
    pool = BlockPool(num_blocks=2)
    block = pool.allocate()
    pool.pin(block)
    pool.free(block)  # the table's reference; the pin's remains
    with pytest.raises(PinnedBlockError, match=r"release it with unpin\(\), not free\(\)") as err:
        pool.free(block)
    assert err.value.block_id == 0
    assert (block.ref_cnt, block.num_pins) == (1, 1)
    assert _counts(pool) == (1, 1, 0, 1)


def test_pin_takes_a_cached_free_block_out_of_the_free_queue() -> None:
    pool = BlockPool(num_blocks=2)
    block = _cached_free_block(pool, H0)
    pool.pin(block)
    assert (block.ref_cnt, block.num_pins) == (1, 1)
    assert _counts(pool) == (1, 1, 0, 1)
    assert pool.allocate().block_id == 1


def test_a_pinned_block_is_never_handed_out() -> None:
    pool = BlockPool(num_blocks=2)
    block = pool.allocate()
    pool.cache(block, H0)
    pool.pin(block)
    pool.free(block)
    assert pool.allocate().block_id == 1
    assert pool.num_free_blocks == 0
    assert pool.lookup(H0) is block


def test_unpinning_the_last_reference_leaves_the_block_cached() -> None:
    pool = BlockPool(num_blocks=2)
    block = _cached_free_block(pool, H0)
    pool.pin(block)
    pool.unpin(block)
    assert (block.ref_cnt, block.num_pins, pool.num_pinned) == (0, 0, 0)
    assert _counts(pool) == (2, 1, 1, 0)
    assert pool.lookup(H0) is block


def test_counts_add_up_through_mixed_operations() -> None:
    pool = BlockPool(num_blocks=5)
    blocks = [pool.allocate() for _ in range(4)]
    pool.cache(blocks[0], H0)
    pool.cache(blocks[1], H1)
    pool.pin(blocks[1])
    for block in blocks:
        pool.free(block)
    assert _counts(pool) == (4, 3, 1, 1)
    pool.touch(blocks[0])
    assert _counts(pool) == (3, 3, 0, 2)
    pool.unpin(blocks[1])
    assert _counts(pool) == (4, 3, 1, 1)
    pool.allocate_after(blocks[1])
    assert _counts(pool) == (3, 2, 1, 2)


# -- batches ------------------------------------------------------------------------------
def test_allocate_blocks_and_free_blocks_match_one_block_at_a_time() -> None:
    """The batch calls the block manager uses hand out and take back the same blocks, in
    the same free-queue order, as ``allocate_after`` and ``free`` one by one."""
    rng = random.Random(7)
    one, batch = BlockPool(num_blocks=64), BlockPool(num_blocks=64)
    seqs: list[tuple[list, list]] = []
    next_hash = 0
    for _ in range(400):
        if seqs and (one.num_free_blocks < 8 or rng.random() < 0.45):
            a, b = seqs.pop(rng.randrange(len(seqs)))
            for i in range(rng.randrange(len(a) + 1)):  # a computed prefix gets cached
                one.cache(a[i], next_hash.to_bytes(16, "little"))
                batch.cache(b[i], next_hash.to_bytes(16, "little"))
                next_hash += 1
            for block in reversed(a):
                one.free(block)
            batch.free_blocks(reversed(b))
        else:
            n = rng.randint(1, min(8, one.num_free_blocks))
            k = rng.randrange(len(seqs) + 1)  # grow after another sequence's last block
            after_a, after_b = (seqs[k][0][-1], seqs[k][1][-1]) if k < len(seqs) else (None, None)
            a: list = []
            for _ in range(n):
                after_a = one.allocate_after(after_a)
                a.append(after_a)
            b = batch.allocate_blocks(n, after_b)
            seqs.append((a, b))
        assert [x.block_id for a, _ in seqs for x in a] == [x.block_id for _, b in seqs for x in b]
        assert [x.block_id for x in one._free_queue] == [x.block_id for x in batch._free_queue]
        assert _counts(one) == _counts(batch)
        assert one.cached.keys() == batch.cached.keys()


def test_free_blocks_stops_at_a_double_free_after_freeing_the_ones_before() -> None:
    pool = BlockPool(num_blocks=3)
    b0, b1, b2 = pool.allocate_blocks(3)
    pool.free(b1)
    with pytest.raises(DoubleFreeError):
        pool.free_blocks([b2, b1, b0])
    assert b2.ref_cnt == 0 and b0.ref_cnt == 1
    assert _counts(pool) == (2, 2, 0, 1)
