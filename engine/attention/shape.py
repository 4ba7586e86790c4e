"""What attention kernels are compiled for: a model's heads, its head size, the cache's
block size and the dtype.

The Triton kernels take each of these as a constexpr (or derive one from it), so a
kernel that compiled and ran for one shape says little about another. The startup probe
(``triton_probe``) runs the model's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.validation import require_int

if TYPE_CHECKING:
    from engine.model_config import ModelConfig

__all__ = ["AttentionShape"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionShape:
    num_heads: int  # query heads
    num_kv_heads: int  # a divisor of num_heads (grouped-query attention)
    head_dim: int
    block_size: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        for name in ("num_heads", "num_kv_heads", "head_dim", "block_size"):
            require_int(name, getattr(self, name), minimum=1)
        assert self.num_heads % self.num_kv_heads == 0, (self.num_heads, self.num_kv_heads)

    @classmethod
    def of(cls, model: ModelConfig, *, block_size: int, dtype: torch.dtype) -> AttentionShape:
        return cls(
            num_heads=model.num_heads,
            num_kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            block_size=block_size,
            dtype=dtype,
        )

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads
