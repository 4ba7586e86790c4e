"""The scheduler's reserve on its own (no model): a request joins the running ones only
with room for its next token and the watermark (1% of the pool) left free; one that
would run alone needs neither."""

from __future__ import annotations

import torch

from engine.block_manager import BlockManager
from engine.kv_cache import KVCache
from engine.request import Request, RequestStatus
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler

BLOCK = 16
NUM_BLOCKS = 200  # a watermark of 2 blocks


def _scheduler() -> Scheduler:
    manager = BlockManager(num_blocks=NUM_BLOCKS, block_size=BLOCK)
    cache = KVCache(
        num_layers=1,
        num_blocks=NUM_BLOCKS,
        block_size=BLOCK,
        num_kv_heads=1,
        head_dim=2,
        num_host_blocks=0,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    return Scheduler(
        block_manager=manager, kv_cache=cache, max_num_seqs=8, max_num_batched_tokens=8192
    )


def _request(arrival: int, num_tokens: int) -> Request:
    # Distinct tokens per request: no prefix-cache hit changes the count.
    tokens = [(arrival * 7919 + t) % 50_000 for t in range(num_tokens)]
    return Request(
        request_id=f"r{arrival}",
        token_ids=tokens,
        num_prompt_tokens=num_tokens,
        sampling=SamplingParams(max_tokens=1),
        arrival=arrival,
    )


def test_a_request_alone_needs_no_reserve() -> None:
    scheduler = _scheduler()
    whole_pool = _request(0, NUM_BLOCKS * BLOCK)
    scheduler.add(whole_pool)
    scheduler.schedule()
    assert whole_pool.status is RequestStatus.RUNNING


def test_beside_a_running_request_the_next_token_and_the_watermark_stay_free() -> None:
    running = 100  # blocks the first request holds: 100 stay free
    cases = {
        # known tokens: (blocks with its next token, admitted?)
        98 * BLOCK - 1: (98, True),  # 98 + 2 watermark = 100
        98 * BLOCK: (99, False),  # 98 blocks, but its next token opens a 99th
        99 * BLOCK - 1: (99, False),  # 99 would fit the pool, not the watermark
    }
    for num_tokens, (num_blocks, admitted) in cases.items():
        scheduler = _scheduler()
        first, second = _request(0, running * BLOCK), _request(1, num_tokens)
        scheduler.add(first)
        scheduler.add(second)
        scheduler.schedule()
        assert first.status is RequestStatus.RUNNING
        assert -(-(num_tokens + 1) // BLOCK) == num_blocks
        expected = RequestStatus.RUNNING if admitted else RequestStatus.WAITING
        assert second.status is expected, num_tokens
