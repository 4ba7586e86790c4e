"""The contract between the model and its attention kernels."""

from __future__ import annotations

from typing import Protocol

import torch

from engine.attention.metadata import AttentionMetadata

__all__ = ["AttentionBackend"]


class AttentionBackend(Protocol):
    """Paged attention over block tables.

    ``prepare`` is called once per engine step, before any layer runs, so a backend
    can plan the step (runs of contiguous blocks, index tensors) once for all layers.
    ``forward`` first writes this step's ``k`` and ``v`` into their slots
    (``metadata.slot_mapping``) of the layer's caches, then attends causally.
    Grouped-query attention: ``num_q_heads`` is a multiple of ``num_kv_heads``.
    """

    name: str

    def prepare(self, metadata: AttentionMetadata) -> None: ...

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        key_cache: torch.Tensor,  # [N, B, Hkv, D]
        value_cache: torch.Tensor,  # [N, B, Hkv, D]
        metadata: AttentionMetadata,
        *,
        scale: float,
    ) -> torch.Tensor:  # [T, Hq, D]
        ...
