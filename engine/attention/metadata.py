"""What one engine step tells the attention kernels about its batch.

The step's batch is flattened: ``S`` sequences contribute ``T`` new tokens in all, the
tokens of sequence ``s`` being ``query_start_loc[s]:query_start_loc[s + 1]``. A decode
contributes one token, a prefill chunk many. Sequence ``s`` holds ``seq_lens[s]`` tokens
of context once this step's tokens are written, so its new token ``j`` sits at position
``seq_lens[s] - query_lens[s] + j`` and attends to every position up to its own (causal).

Tensors live on the model's device, all views of one buffer copied there at once
(``stage_int64``); the ``*_cpu`` tuples mirror them for code that plans in Python (the
reference kernel, run detection) without a device sync.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.host_staging import stage_values

__all__ = ["AttentionMetadata", "stage_int64"]


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
        metadata, _ = cls.build_staged(
            block_size=block_size,
            query_lens=query_lens,
            seq_lens=seq_lens,
            block_tables=block_tables,
            device=device,
        )
        return metadata

    @classmethod
    def build_staged(
        cls,
        *,
        block_size: int,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        device: torch.device,
        extra: Sequence[Sequence[int]] = (),
    ) -> tuple[AttentionMetadata, list[torch.Tensor]]:
        """``build``, plus ``extra`` int64 arrays (the step's token ids, positions, ...)
        staged with the metadata in one host buffer and one copy (``stage_int64``)."""
        assert len(query_lens) == len(seq_lens) == len(block_tables)
        slots: list[int] = []
        for q_len, s_len, table in zip(query_lens, seq_lens, block_tables, strict=True):
            assert 0 < q_len <= s_len <= len(table) * block_size
            for pos in range(s_len - q_len, s_len):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        width = max((len(t) for t in block_tables), default=0)
        padded: list[int] = []
        for table in block_tables:
            padded.extend(table)
            padded.extend([0] * (width - len(table)))
        starts = [0]
        for q_len in query_lens:
            starts.append(starts[-1] + q_len)
        staged = stage_int64([starts, seq_lens, padded, slots, *extra], device)
        metadata = cls(
            block_size=block_size,
            query_start_loc=staged[0],
            seq_lens=staged[1],
            block_tables=staged[2].view(len(block_tables), width),
            slot_mapping=staged[3],
            query_lens_cpu=tuple(query_lens),
            seq_lens_cpu=tuple(seq_lens),
            block_tables_cpu=tuple(tuple(t) for t in block_tables),
        )
        return metadata, staged[4:]


def stage_int64(arrays: Sequence[Sequence[int]], device: torch.device) -> list[torch.Tensor]:
    """The arrays as int64 tensors on ``device``, views of one buffer.

    On a GPU the buffer is built in pinned host memory and copied with one non-blocking
    transfer (``engine.host_staging``): no synchronization with the device (a
    ``torch.tensor(..., device=cuda)`` per array would block the host on each copy from
    pageable memory). On a CPU the buffer is the tensors.
    """
    sizes = [len(a) for a in arrays]
    flat = list(itertools.chain.from_iterable(arrays))
    staged = stage_values(flat, dtype=torch.int64, device=device)
    return list(staged.split(sizes))
