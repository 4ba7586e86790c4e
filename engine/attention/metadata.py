"""What one engine step tells the attention kernels about its batch.

The step's batch is flattened: ``S`` sequences contribute ``T`` new tokens in all, the
tokens of sequence ``s`` being ``query_start_loc[s]:query_start_loc[s + 1]``. A decode
contributes one token, a prefill chunk many. Sequence ``s`` holds ``seq_lens[s]`` tokens
of context once this step's tokens are written, so its new token ``j`` sits at position
``seq_lens[s] - query_lens[s] + j`` and attends to every position up to its own (causal).

Tensors live on the model's device; the ``*_cpu`` tuples mirror them for code that plans
in Python (the reference kernel, run detection) without a device sync.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["AttentionMetadata"]


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    block_size: int
    query_start_loc: torch.Tensor  # [S + 1] int64
    seq_lens: torch.Tensor  # [S] int64
    block_tables: torch.Tensor  # [S, max_blocks] int64, padded with 0 past each table
    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset of each new token
    query_lens_cpu: tuple[int, ...]
    seq_lens_cpu: tuple[int, ...]
    block_tables_cpu: tuple[tuple[int, ...], ...]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens_cpu)

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.query_lens_cpu)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu, default=0)

    @classmethod
    def build(
        cls,
        *,
        block_size: int,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        device: torch.device,
    ) -> AttentionMetadata:
        """Derive the tensors from per-sequence lists (query lens, context lens, tables)."""
        assert len(query_lens) == len(seq_lens) == len(block_tables)
        slots: list[int] = []
        for q_len, s_len, table in zip(query_lens, seq_lens, block_tables, strict=True):
            assert 0 < q_len <= s_len <= len(table) * block_size
            for pos in range(s_len - q_len, s_len):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        width = max((len(t) for t in block_tables), default=0)
        padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
        starts = [0]
        for q_len in query_lens:
            starts.append(starts[-1] + q_len)

        def as_tensor(values: object) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)

        return cls(
            block_size=block_size,
            query_start_loc=as_tensor(starts),
            seq_lens=as_tensor(list(seq_lens)),
            block_tables=as_tensor(padded).reshape(len(padded), width),
            slot_mapping=as_tensor(slots),
            query_lens_cpu=tuple(query_lens),
            seq_lens_cpu=tuple(seq_lens),
            block_tables_cpu=tuple(tuple(t) for t in block_tables),
        )
