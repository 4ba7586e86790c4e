"""The moves the block manager returns, performed by a real ``KVCache``, keep each
sequence's K/V bit for bit: copy on write after a fork, swap out and back in."""

from __future__ import annotations

import torch

from engine import BlockManager, KVCache

BLOCK_SIZE = 4


def _write(cache: KVCache, manager: BlockManager, seq: str, start: int, tag: float) -> None:
    # Token t of ``seq`` gets K = tag + t and V = -(tag + t) in every layer and head.
    ids = manager.block_ids(seq)
    for pos in range(start, manager.num_tokens(seq)):
        block, slot = ids[pos // BLOCK_SIZE], pos % BLOCK_SIZE
        cache.kv[0, :, block, slot] = tag + pos
        cache.kv[1, :, block, slot] = -(tag + pos)


def _read(cache: KVCache, manager: BlockManager, seq: str) -> torch.Tensor:
    ids = torch.tensor(manager.block_ids(seq))
    n = manager.num_tokens(seq)
    return cache.kv[:, :, ids].flatten(2, 3)[:, :, :n].clone()  # [2, L, n, H, D]


def test_copy_on_write_and_swap_round_trip_preserve_kv() -> None:
    manager = BlockManager(num_blocks=16, block_size=BLOCK_SIZE, num_host_blocks=8)
    cache = KVCache(
        num_layers=3,
        num_blocks=16,
        block_size=BLOCK_SIZE,
        num_kv_heads=2,
        head_dim=8,
        num_host_blocks=8,
    )
    manager.allocate("parent", list(range(6)))
    _write(cache, manager, "parent", 0, tag=100.0)
    manager.fork("parent", "child")
    shared_prefix = _read(cache, manager, "parent")

    result = manager.append("child", [7, 8])  # writes into the shared partial block
    assert len(result.copies) == 1
    cache.copy_blocks(result.copies)
    _write(cache, manager, "child", 6, tag=500.0)
    child = _read(cache, manager, "child")
    assert torch.equal(child[:, :, :6], shared_prefix)
    assert torch.equal(_read(cache, manager, "parent"), shared_prefix)

    cache.swap_out(manager.swap_out("child"))
    manager.allocate("other", list(range(50, 70)))  # reuses the freed device blocks
    _write(cache, manager, "other", 0, tag=900.0)
    cache.swap_in(manager.swap_in("child"))
    assert torch.equal(_read(cache, manager, "child"), child)
    assert torch.equal(_read(cache, manager, "parent"), shared_prefix)
