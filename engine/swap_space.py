"""Host swap space: moving a sequence's blocks between the device pool and the host pool.

The block manager resolves sequence ids and states; this file owns the block moves. A
sequence swapped out gives its device blocks back to the pool, where its computed full
blocks stay cached, so a swap-in soon after reuses them without a copy; only the others
come back from host memory.
"""

from __future__ import annotations

import operator

from engine.block import KVCacheBlock
from engine.block_pool import BlockPool
from engine.block_results import BlockMove, Fit, Shortfall
from engine.block_table import BlockTable, SequenceState
from engine.errors import OutOfBlocksError, OutOfSwapSpaceError

__all__ = ["SwapSpace"]

_FITS = Fit()
_REF_CNT = operator.attrgetter("ref_cnt")


class SwapSpace:
    __slots__ = (
        "_refused",
        "_refused_at",
        "device_pool",
        "host_pool",
        "num_blocks_swapped_in",
        "num_blocks_swapped_out",
        "num_swap_outs",
    )

    def __init__(self, *, device_pool: BlockPool, host_pool: BlockPool) -> None:
        self.device_pool = device_pool
        self.host_pool = host_pool
        # Blocks copied device -> host and host -> device since the start: the moves the
        # swaps returned, which is what a benchmark of offload and restore must have moved.
        self.num_blocks_swapped_out = 0
        self.num_blocks_swapped_in = 0
        # Sequences swapped out since the start: one per offload, hold moved to host or
        # preemption by swap, however many blocks it moved.
        self.num_swap_outs = 0
        # Swap-ins refused since the device pool's room last changed (its
        # ``num_room_changes``): by table, with the extra blocks asked and the refusal. A
        # context waiting to come back is asked at every step; until room changes the
        # answer stays no, and finding it costs a cache lookup a block.
        self._refused: dict[int, tuple[BlockTable, int, Fit]] = {}
        self._refused_at = -1

    def can_swap_out(self, table: BlockTable) -> Fit:
        needed, available = len(table.blocks), self.host_pool.num_free_blocks
        if needed > available:
            return Fit(Shortfall.HOST_POOL, needed, available)
        return _FITS

    def swap_out(self, table: BlockTable) -> tuple[BlockMove, ...]:
        """(device, host) moves for every block; the device blocks return to the pool."""
        fit = self.can_swap_out(table)
        if not fit:
            raise OutOfSwapSpaceError(fit.needed, fit.available)
        host_blocks = [self.host_pool.allocate() for _ in table.blocks]
        pairs = zip(table.blocks, host_blocks, strict=True)
        moves = tuple((dev.block_id, host.block_id) for dev, host in pairs)
        self.device_pool.free_blocks(reversed(table.blocks))
        table.blocks = host_blocks
        table.state = SequenceState.SWAPPED
        self.num_blocks_swapped_out += len(moves)
        self.num_swap_outs += 1
        return moves

    def can_swap_in(self, table: BlockTable, num_extra_blocks: int = 0) -> Fit:
        """Room to bring the sequence back with ``num_extra_blocks`` more left free. A
        refusal repeated before room changed carries the figures it was found with."""
        if len(table.blocks) + num_extra_blocks <= self.device_pool.num_free_blocks:
            return _FITS  # room for every block, whatever the cache still holds
        room = self.device_pool.num_room_changes
        if room != self._refused_at:
            self._refused.clear()
            self._refused_at = room
        refused = self._refused.get(id(table))
        if refused is not None and refused[0] is table and refused[1] == num_extra_blocks:
            return refused[2]
        fit = self._plan_swap_in(table, num_extra_blocks)[0]
        if not fit:
            self._refused[id(table)] = (table, num_extra_blocks, fit)
        return fit

    def swap_in(self, table: BlockTable) -> tuple[BlockMove, ...]:
        """(host, device) moves for the blocks the prefix cache no longer holds."""
        fit, hits = self._plan_swap_in(table)
        if not fit:
            raise OutOfBlocksError(fit.needed, fit.available)
        pool = self.device_pool
        for block in hits:
            if block is not None:
                pool.touch(block)
        device_blocks: list[KVCacheBlock] = []
        moves: list[BlockMove] = []
        prev: KVCacheBlock | None = None
        for i, (host, hit) in enumerate(zip(table.blocks, hits, strict=True)):
            if hit is None:
                prev = pool.allocate_after(prev)
                moves.append((host.block_id, prev.block_id))
                if i < table.num_cached_blocks:  # its content is computed K/V again
                    pool.cache(prev, table.block_hashes[i])
            else:
                prev = hit
            device_blocks.append(prev)
        self.host_pool.free_blocks(reversed(table.blocks))
        table.blocks = device_blocks
        table.state = SequenceState.RESIDENT
        self.num_blocks_swapped_in += len(moves)
        return tuple(moves)

    def _plan_swap_in(
        self, table: BlockTable, num_extra_blocks: int = 0
    ) -> tuple[Fit, list[KVCacheBlock | None]]:
        """The room a swap-in needs (a block for each one the prefix cache no longer
        holds, or holds unused) and the cached block found for each of the table's."""
        num_blocks = len(table.blocks)
        num_cached = min(table.num_cached_blocks, num_blocks)
        # In C, not a Python loop: a context waiting to come back is asked at every step.
        hits: list[KVCacheBlock | None] = list(
            map(self.device_pool.cached.get, table.block_hashes[:num_cached])
        )
        hits.extend([None] * (num_blocks - num_cached))
        in_use = sum(map(bool, map(_REF_CNT, filter(None, hits))))
        needed = num_blocks - in_use + num_extra_blocks
        available = self.device_pool.num_free_blocks
        if needed > available:
            return Fit(Shortfall.POOL, needed, available), hits
        return _FITS, hits
