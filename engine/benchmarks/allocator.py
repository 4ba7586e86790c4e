"""``kvgov bench allocator``: speed of the block pool and prefix cache, and KV waste.

Figures (targets from the foundation issue, on a 2-core CPU):
- ``alloc_free_blocks_per_s``: one-block allocate plus free in a 10,000-block pool with
  prefix caching on and half the pool holding cached content (>= 1,000,000).
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
from collections.abc import Callable, Iterator

from engine.benchmarks.measurement import Direction, Measurement
from engine.block_manager import BlockManager
from engine.block_pool import BlockPool

__all__ = ["run"]

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


def _alloc_free(*, num_ops: int, repeats: int) -> Measurement:
    pool = BlockPool(num_blocks=10_000, enable_caching=True)
    held = [pool.allocate() for _ in range(5_000)]
    for i, block in enumerate(held):
        pool.cache(block, i.to_bytes(16, "little"))
    for block in held:
        pool.free(block)
    allocate, free = pool.allocate, pool.free

    def work() -> int:
        for _ in range(num_ops):
            free(allocate())
        return num_ops

    return Measurement(
        bench=_BENCH,
        metric="alloc_free_blocks_per_s",
        value=_median_rate(work, repeats),
        unit="blocks/s",
        target=1_000_000,
        note="10,000-block pool, prefix caching on, 50% cached",
    )


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
