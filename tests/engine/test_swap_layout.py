"""Swap space: block-major host memory, one copy per run of blocks, sized in blocks."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, InvalidRequestError
from engine.kv_cache import KVCache, _runs

SIZES = {"num_layers": 3, "num_blocks": 6, "num_kv_heads": 2, "head_dim": 4, "block_size": 2}


def test_each_host_block_is_one_contiguous_piece_of_every_layer() -> None:
    cache = KVCache(**SIZES, num_host_blocks=4, device="cpu")
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=torch.Generator().manual_seed(0)))
    cache.swap_out([(2, 1), (5, 3)])
    # Host block 1 is device block 2's K and V of every layer, in one contiguous chunk.
    assert cache.host_blocks.shape == (4, 2, 3, 2, 2, 4)
    assert cache.host_blocks[1].is_contiguous()
    assert torch.equal(cache.host_blocks[1], cache.kv[:, :, 2])
    assert torch.equal(cache.host_blocks[3], cache.kv[:, :, 5])
    assert torch.equal(cache.host_kv[:, :, 3], cache.kv[:, :, 5])  # the device-order view
    cache.swap_in([(3, 0)])
    assert torch.equal(cache.kv[:, :, 0], cache.kv[:, :, 5])


def test_consecutive_blocks_move_in_one_copy() -> None:
    assert _runs([4, 5, 6, 9, 10, 2]) == [(0, 4, 3), (3, 9, 2), (5, 2, 1)]
    assert _runs([]) == []


def test_swap_space_is_sized_in_blocks() -> None:
    engine = Engine(EngineConfig(num_blocks=16, swap_space_blocks=5))
    assert engine.kv_cache.num_host_blocks == engine.capacity().num_host_blocks == 5
    with pytest.raises(InvalidRequestError, match="swap_space_blocks"):
        EngineConfig(swap_space_blocks=-1)


@pytest.mark.gpu
def test_block_moves_run_without_blocking_the_host() -> None:
    cache = KVCache(**SIZES, num_host_blocks=4, device="cuda")
    cache.kv.copy_(torch.randn(cache.kv.shape, device=cache.device).to(cache.dtype))
    before = cache.kv.clone()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        cache.copy_blocks([(0, 1)])  # copy-on-write, mid-step
        cache.swap_out([(2, 1), (3, 2), (5, 3)])
        cache.kv[:, :, 2:4].zero_()  # reusing the freed blocks waits for the gather only
        cache.swap_in([(1, 4), (2, 5)])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    cache.synchronize()
    torch.cuda.synchronize()
    assert torch.equal(cache.host_blocks[3].to(cache.device), before[:, :, 5])
    assert torch.equal(cache.kv[:, :, 4], before[:, :, 2])
    assert torch.equal(cache.kv[:, :, 5], before[:, :, 3])
    assert torch.equal(cache.kv[:, :, 1], before[:, :, 0])
