"""What the engine reports about itself: capacity, metrics, the KV map and the whole
snapshot a live view draws. Read-only, and only between two steps (on the engine's own
thread), so every figure of one call comes from one instant."""

from __future__ import annotations

from collections.abc import Mapping

from engine.block_manager import BlockManager
from engine.block_table import SequenceState
from engine.kv_cache import KVCache
from engine.outputs import (
    BudgetBlocks,
    Capacity,
    EngineMetrics,
    EngineSnapshot,
    KVSnapshot,
    RequestInfo,
)
from engine.prefill_counter import PrefillCounter
from engine.request import Request
from engine.retention import RetainedContexts
from engine.scheduler import Scheduler

__all__ = ["Introspection"]


class Introspection:
    """Reads the engine's parts; holds no state of its own. ``requests`` is the engine's
    own map of the requests it knows, read as it is at each call."""

    __slots__ = (
        "_kv_cache",
        "_manager",
        "_max_model_len",
        "_prefill",
        "_requests",
        "_retained",
        "_scheduler",
    )

    def __init__(
        self,
        *,
        block_manager: BlockManager,
        scheduler: Scheduler,
        kv_cache: KVCache,
        retained: RetainedContexts,
        prefill: PrefillCounter,
        requests: Mapping[str, Request],
        max_model_len: int,
    ) -> None:
        self._manager = block_manager
        self._scheduler = scheduler
        self._kv_cache = kv_cache
        self._retained = retained
        self._prefill = prefill
        self._requests = requests
        self._max_model_len = max_model_len

    def capacity(self) -> Capacity:
        pool = self._manager.pool
        return Capacity(
            block_size=self._manager.block_size,
            num_blocks=pool.num_blocks,
            num_free_blocks=pool.num_free_blocks,
            num_pinned_blocks=pool.num_pinned,
            num_host_blocks=self._manager.host_pool.num_blocks,
            bytes_per_block=self._kv_cache.bytes_per_block,
            max_model_len=self._max_model_len,
        )

    def metrics(self) -> EngineMetrics:
        manager, scheduler = self._manager, self._scheduler
        stats = manager.stats()
        return EngineMetrics(
            num_blocks=stats.num_blocks,
            num_blocks_in_use=stats.num_in_use,
            num_blocks_free=stats.num_free,
            num_blocks_cached=stats.num_cached,
            num_blocks_pinned=stats.num_pinned,
            num_blocks_swapped=stats.num_swapped,
            num_requests_running=len(scheduler.running),
            num_requests_waiting=len(scheduler.waiting),
            num_requests_swapped=len(scheduler.swapped),
            num_preemptions=scheduler.num_preemptions,
            prefix_cache_queries=stats.prefix_cache_queries,
            prefix_cache_hits=stats.prefix_cache_hits,
            num_prefill_tokens=self._prefill.num_prefill_tokens,
            num_recomputed_tokens=self._prefill.num_recomputed_tokens,
            num_blocks_swapped_out=manager.swap_space.num_blocks_swapped_out,
            num_blocks_swapped_in=manager.swap_space.num_blocks_swapped_in,
            num_swap_outs=manager.swap_space.num_swap_outs,
            num_holds_reclaimed=self._retained.num_reclaimed,
            tokens_per_sequence={
                rid: r.num_tokens for rid, r in self._requests.items() if not r.is_finished
            },
            # Every in-use slot holds a token but the empty tail of each sequence's last
            # block (swapped sequences' tails too: exact while nothing is swapped).
            num_tokens_in_use=max(
                0,
                stats.num_in_use * manager.block_size
                - (stats.num_allocated_slots - stats.num_tokens),
            ),
        )

    def kv_snapshot(self) -> KVSnapshot:
        """Each open budget's blocks (on the device and offloaded), the pinned prefixes'
        blocks and the pool's counts, read together."""
        manager = self._manager
        budgets = {}
        for budget in manager.budgets:
            seq_ids = list(budget.seq_ids)
            held = self._retained.held_seq_id(budget.name)
            if held is not None:
                seq_ids.append(held)
            device: set[int] = set()
            num_tokens = num_host = num_host_tokens = 0
            for seq_id in seq_ids:
                if manager.sequence_state(seq_id) is SequenceState.SWAPPED:
                    num_host += len(manager.block_ids(seq_id))
                    num_host_tokens += manager.num_tokens(seq_id)
                else:
                    device.update(manager.block_ids(seq_id))
                    num_tokens += manager.num_tokens(seq_id)
            budgets[budget.name] = BudgetBlocks(
                frozenset(device), num_tokens, num_host, budget.max_blocks, num_host_tokens
            )
        counts = self.metrics()
        return KVSnapshot(
            budgets=budgets,
            pinned_block_ids=frozenset(b.block_id for b in manager.pool.blocks if b.num_pins),
            num_blocks=counts.num_blocks,
            num_blocks_in_use=counts.num_blocks_in_use,
            num_tokens_in_use=counts.num_tokens_in_use,
        )

    def snapshot(self) -> EngineSnapshot:
        """Metrics, capacity, the KV map and the unfinished requests, read together: one
        instant, so a live view's figures agree."""
        s = self._scheduler
        queues = {"running": s.running, "waiting": s.waiting, "swapped": s.swapped}
        requests = tuple(RequestInfo.of(r, state) for state, queue in queues.items() for r in queue)
        return EngineSnapshot(self.metrics(), self.capacity(), self.kv_snapshot(), requests)
