"""``kvgov bench allocator``: the workloads behind its figures do what the notes say."""

from __future__ import annotations

import random
from itertools import count

from engine.benchmarks.allocator import Churn, _waste, churn, fill
from engine.block import KVCacheBlock
from engine.block_pool import BlockPool


class CountingPool(BlockPool):
    """The real pool, recording every block it hands out and every cached block it evicts
    (the only thing that shrinks ``cached`` in the churn is an eviction)."""

    def __init__(self, *, num_blocks: int) -> None:
        super().__init__(num_blocks=num_blocks, enable_caching=True)
        self.touched: set[int] = set()
        self.num_evicted = 0

    def allocate_blocks(
        self, num_blocks: int, after: KVCacheBlock | None = None
    ) -> list[KVCacheBlock]:
        before = len(self.cached)
        blocks = super().allocate_blocks(num_blocks, after)
        self.num_evicted += before - len(self.cached)
        self.touched.update(block.block_id for block in blocks)
        return blocks


def test_the_churn_spans_the_pool_and_evicts_cached_blocks_every_round() -> None:
    shape = Churn()
    pool = CountingPool(num_blocks=shape.num_blocks)
    live = fill(pool, shape)
    warm_hashes = set(pool.cached)
    assert len(warm_hashes) == shape.num_cached - pool.num_evicted  # fill took some already
    # fill leaves no empty block (the live sequences need more than the empty half), so
    # each round reuses the half it freed uncached and evicts the other half.
    assert pool.num_empty == 0
    pool.num_evicted = 0
    num_rounds = 200
    hashes = (i.to_bytes(16, "little") for i in count(1 << 40))
    assert churn(pool, live, hashes, num_rounds) == num_rounds * shape.seq_blocks
    assert pool.num_evicted == num_rounds * (shape.seq_blocks // 2)
    assert pool.touched == set(range(shape.num_blocks))  # every block, not one reused
    assert not warm_hashes & set(pool.cached)  # the starting cache was evicted too
    assert len(live) == shape.num_live
    assert pool.num_in_use == shape.num_live * shape.seq_blocks


def test_waste_pct_is_the_seeded_tail_waste_and_under_one_percent() -> None:
    rng = random.Random(0)  # the benchmark draws the 8 lengths first
    lengths = [rng.randint(1_500, 4_500) for _ in range(8)]
    slots = sum(-(-length // 16) * 16 for length in lengths)
    expected = 100 * (slots - sum(lengths)) / slots
    figures = {m.metric: m for m in _waste(seed=0)}
    waste = figures["waste_pct"]
    assert waste.value == expected
    assert waste.value < 1  # the README's "under 1%"
    assert waste.met
    contiguous = figures["contiguous_waste_pct"].value
    assert contiguous == 100 * (8 * 8_000 - sum(lengths)) / (8 * 8_000)
