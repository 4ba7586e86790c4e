"""The KV layout both attention benchmarks read: block tables as the engine's block
manager hands them out (prompts in runs, then tokens decoded round-robin), and the same
keys or values gathered into one contiguous tensor for the SDPA baseline."""

from __future__ import annotations

import random

import torch

from engine.block_manager import BlockManager

__all__ = ["BLOCK_SIZE", "DECODED", "NUM_SEQS", "SEQ_LEN", "allocator_layout", "contiguous_kv"]

NUM_SEQS, SEQ_LEN, DECODED, BLOCK_SIZE = 8, 4_096, 512, 16


def allocator_layout(seed: int) -> tuple[list[list[int]], int]:
    """Block tables of ``NUM_SEQS`` sequences of ``SEQ_LEN`` tokens, and the pool size."""
    rng = random.Random(seed)
    num_blocks = NUM_SEQS * (SEQ_LEN // BLOCK_SIZE + 1)
    manager = BlockManager(num_blocks=num_blocks, block_size=BLOCK_SIZE)
    prompt = SEQ_LEN - DECODED
    for seq in range(NUM_SEQS):
        manager.allocate(seq, [rng.randrange(100_000) for _ in range(prompt)])
    for _ in range(DECODED):
        for seq in range(NUM_SEQS):
            manager.append(seq, [rng.randrange(100_000)])
    return [manager.block_ids(seq) for seq in range(NUM_SEQS)], num_blocks


def contiguous_kv(cache: torch.Tensor, tables: list[list[int]]) -> torch.Tensor:
    blocks = torch.tensor(tables)  # [S, W]
    keys = cache[blocks].flatten(1, 2)[:, :SEQ_LEN]  # [S, L, Hkv, D]
    return keys.transpose(1, 2).contiguous()  # [S, Hkv, L, D]
