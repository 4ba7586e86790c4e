"""What the BlockManager tests share: a small manager and the sequences they feed it."""

from __future__ import annotations

from collections.abc import Hashable

from engine.block_manager import BlockManager

BS = 4  # small blocks keep the arithmetic readable


def toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def manager(num_blocks: int = 8, **kwargs: object) -> BlockManager:
    return BlockManager(num_blocks=num_blocks, block_size=BS, **kwargs)  # type: ignore[arg-type]


def computed(m: BlockManager, seq_id: Hashable, token_ids: list[int], **kwargs: object):
    """Allocate a sequence and mark all of its tokens computed."""
    allocation = m.allocate(seq_id, token_ids, **kwargs)  # type: ignore[arg-type]
    m.mark_computed(seq_id, len(token_ids))
    return allocation


def snapshot(m: BlockManager, *seq_ids: Hashable) -> tuple:
    """Everything a refused call must leave as it was."""
    return (
        m.stats(),
        [budget.info() for budget in m.budgets],
        {s: (m.block_ids(s), m.num_tokens(s), m.sequence_state(s)) for s in seq_ids},
        [(b.ref_cnt, b.num_pins, b.block_hash) for b in m.pool.blocks],
        [b.block_id for b in m.pool._free_queue],
        [(b.ref_cnt, b.block_hash) for b in m.host_pool.blocks],
    )
