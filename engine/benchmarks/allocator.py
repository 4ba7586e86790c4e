"""``kvgov bench allocator``: speed of the block pool and prefix cache, and KV waste.

Figures (targets from the foundation issue, on a 2-core CPU):
- ``alloc_free_blocks_per_s``: blocks allocated and freed per second as sequences of 64
  blocks come and go, 120 live at once in a 10,000-block pool with prefix caching on
  that starts half cached; half of each ended sequence's blocks are cached, so the
  allocations evict cached blocks all along (>= 1,000,000; ``churn``).
- ``prefix_lookup_blocks_per_s``: hash every block of fresh 512-token requests and find
  the longest cached prefix among 200 cached 512-token sequences (>= 500,000).
- ``waste_pct``: unused allocated slots over allocated slots for 8 sequences of 1,500 to
  4,500 tokens grown token by token, 16-token blocks (<= 0.5), beside
  ``contiguous_waste_pct``, the same sequences under a reserve-for-8k scheme (about 63).

Each timed figure is the median of several repeats: these machines are shared.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from engine.benchmarks.measurement import Direction, Measurement
from engine.block import KVCacheBlock
from engine.block_manager import BlockManager
from engine.block_pool import BlockPool

__all__ = ["Churn", "churn", "fill", "run"]

_BENCH = "allocator"
_BLOCK_SIZE = 16


def run(*, quick: bool = False, seed: int = 0) -> Iterator[Measurement]:
    repeats = 3 if quick else 5
    yield _alloc_free(num_ops=100_000 if quick else 1_000_000, repeats=repeats)
    yield _prefix_lookup(num_requests=200 if quick else 2_000, repeats=repeats, seed=seed)
    yield from _waste(seed=seed)


def _median_rate(work: Callable[[], int], repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        count = work()
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates)


@dataclass(frozen=True, slots=True)
class Churn:
    """The sequence churn ``alloc_free_blocks_per_s`` times (see ``churn``)."""

    num_blocks: int = 10_000
    seq_blocks: int = 64  # a 1,024-token sequence
    num_live: int = 120  # sequences held at once: 7,680 blocks, 77% of the pool
    num_cached: int = 5_000  # cached free blocks at the start: half the pool


def fill(pool: BlockPool, churn: Churn) -> deque[list[KVCacheBlock]]:
    """Half the pool cached and free, then ``num_live`` sequences allocated: the state
    each timed run starts from. Returns the live sequences, oldest first."""
    warm = pool.allocate_blocks(churn.num_cached)
    for i, block in enumerate(warm):
        pool.cache(block, _hash(i))
    pool.free_blocks(reversed(warm))
    return deque(pool.allocate_blocks(churn.seq_blocks) for _ in range(churn.num_live))


def churn(
    pool: BlockPool, live: deque[list[KVCacheBlock]], hashes: Iterator[bytes], num_rounds: int
) -> int:
    """Each round the oldest live sequence ends (the first half of its blocks cached, as
    a finished prompt's full blocks are, then every block freed tail first) and a new
    one is allocated. Freed empty blocks are reused first, so once they run out every
    allocation evicts the least recently used cached blocks. Returns the blocks
    allocated (each round frees as many)."""
    allocate, free, cache = pool.allocate_blocks, pool.free_blocks, pool.cache
    num_blocks = len(live[0])
    half = num_blocks // 2
    for _ in range(num_rounds):
        ended = live.popleft()
        for block in ended[:half]:
            cache(block, next(hashes))
        free(reversed(ended))
        live.append(allocate(num_blocks))
    return num_rounds * num_blocks


def _alloc_free(*, num_ops: int, repeats: int) -> Measurement:
    shape = Churn()
    num_rounds = num_ops // shape.seq_blocks
    rates, evicted = [], []
    for repeat in range(repeats):
        pool = BlockPool(num_blocks=shape.num_blocks, enable_caching=True)
        live = fill(pool, shape)
        # Distinct from the warm-up's hashes and from each other: every cache() takes.
        start_hash = (repeat + 1) << 40
        hashes = map(_hash, range(start_hash, start_hash + num_rounds * shape.seq_blocks))
        num_cached = len(pool.cached)
        start = time.perf_counter()
        count = churn(pool, live, hashes, num_rounds)
        rates.append(count / (time.perf_counter() - start))
        evicted.append(num_cached + num_rounds * (shape.seq_blocks // 2) - len(pool.cached))
    return Measurement(
        bench=_BENCH,
        metric="alloc_free_blocks_per_s",
        value=statistics.median(rates),
        unit="blocks/s",
        target=1_000_000,
        note=(
            f"{num_rounds:,} sequences of {shape.seq_blocks} blocks allocated and freed, "
            f"{shape.num_live} live at once in a {shape.num_blocks:,}-block pool that starts "
            f"{shape.num_cached:,} cached; half of each ended sequence cached, "
            f"{statistics.median(evicted):,.0f} cached blocks evicted per run; median of {repeats}"
        ),
    )


def _hash(i: int) -> bytes:
    return i.to_bytes(16, "little")


def _prefix_lookup(*, num_requests: int, repeats: int, seed: int) -> Measurement:
    rng = random.Random(seed)
    seq_len, shared = 512, 256
    manager = BlockManager(num_blocks=200 * seq_len // _BLOCK_SIZE + 64, block_size=_BLOCK_SIZE)
    cached = []
    for i in range(200):
        tokens = [rng.randrange(100_000) for _ in range(seq_len)]
        manager.allocate(i, tokens)
        manager.mark_computed(i, seq_len)
        manager.free(i)
        cached.append(tokens)
    requests = [
        rng.choice(cached)[:shared] + [rng.randrange(100_000) for _ in range(seq_len - shared)]
        for _ in range(num_requests)
    ]
    lookup = manager.longest_cached_prefix
    assert lookup(requests[0]) == shared, "benchmark setup: the shared prefix must hit"

    def work() -> int:
        for tokens in requests:
            lookup(tokens)
        return num_requests * seq_len // _BLOCK_SIZE

    return Measurement(
        bench=_BENCH,
        metric="prefix_lookup_blocks_per_s",
        value=_median_rate(work, repeats),
        unit="blocks/s",
        target=500_000,
        note="512-token requests, 256 cached; hashing included",
    )


def _waste(*, seed: int) -> Iterator[Measurement]:
    rng = random.Random(seed)
    lengths = [rng.randint(1_500, 4_500) for _ in range(8)]
    manager = BlockManager(num_blocks=sum(lengths) // _BLOCK_SIZE + 16, block_size=_BLOCK_SIZE)
    for seq_id in range(len(lengths)):
        manager.allocate(seq_id, [rng.randrange(100_000) for _ in range(500)])
    for seq_id, length in enumerate(lengths):  # decode: one token at a time
        for _ in range(length - 500):
            manager.append(seq_id, [rng.randrange(100_000)])
    stats = manager.stats()
    average = sum(lengths) / len(lengths)
    reserve = 8_000
    yield Measurement(
        bench=_BENCH,
        metric="waste_pct",
        value=100 * stats.fragmentation_tokens / stats.num_allocated_slots,
        unit="%",
        target=0.5,
        direction=Direction.LOWER_IS_BETTER,
        note=f"8 sequences, {average:,.0f} tokens on average, 16-token blocks",
    )
    yield Measurement(
        bench=_BENCH,
        metric="contiguous_waste_pct",
        value=100 * (reserve * len(lengths) - sum(lengths)) / (reserve * len(lengths)),
        unit="%",
        note="the same sequences, each reserving 8,000 tokens up front",
    )
