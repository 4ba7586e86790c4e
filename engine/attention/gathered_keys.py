"""Keys copied out of the paged cache: which blocks, their mask, and the workspace.

Attention over a gathered copy needs no contiguous layout in the cache, only a copy.
On CPUs that copy is cheap when it lands in memory that is reused (a fresh multi-MiB
tensor per layer costs a page fault per 4 KiB, more than the copy) and small enough to
stay in the CPU caches for the kernel that reads it next; ``Workspace`` provides that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.host_staging import stage_tensor

__all__ = ["GatheredKeys", "Workspace"]


@dataclass(frozen=True, slots=True)
class GatheredKeys:
    """``R`` key sets of ``W`` blocks each; padding repeats a real block (finite K/V)."""

    blocks: torch.Tensor  # [R, W] int64
    mask: torch.Tensor | None  # [R, 1, Q, W * block_size] float32: 0 visible, -inf not; None: all

    @classmethod
    def build(cls, blocks: torch.Tensor, visible: torch.Tensor) -> GatheredKeys:
        """``visible``: [R, 1, Q, W * block_size] bool."""
        if bool(visible.all()):
            return cls(blocks=blocks, mask=None)
        mask = torch.zeros(visible.shape).masked_fill_(~visible, -math.inf)
        return cls(blocks=blocks, mask=mask)

    @classmethod
    def with_prefixes(
        cls, blocks: torch.Tensor, visible_tokens: Sequence[int], block_size: int
    ) -> GatheredKeys:
        """One query per key set seeing its first ``visible_tokens[r]`` tokens ([R])."""
        num_tokens = blocks.shape[1] * block_size
        if min(visible_tokens) >= num_tokens:
            return cls(blocks=blocks, mask=None)
        visible = torch.tensor(visible_tokens, dtype=torch.int64)
        hidden = torch.arange(num_tokens)[None, :] >= visible[:, None]  # [R, W * B]
        mask = torch.zeros(hidden.shape).masked_fill_(hidden, -math.inf)
        return cls(blocks=blocks, mask=mask[:, None, None, :])

    def to(self, device: torch.device) -> GatheredKeys:
        mask = None if self.mask is None else stage_tensor(self.mask, device)
        return GatheredKeys(blocks=stage_tensor(self.blocks, device), mask=mask)


class Workspace:
    """A reusable buffer that gathers take turns in: each gather overwrites the last."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = torch.empty(0)

    def reserve(self, numel: int, like: torch.Tensor) -> None:
        """Grow (never shrink) to ``numel`` elements of ``like``'s dtype and device."""
        buf = self._buffer
        # An inference-mode tensor cannot be written outside inference mode.
        stale = buf.is_inference() and not torch.is_inference_mode_enabled()
        if stale or buf.numel() < numel or buf.dtype != like.dtype or buf.device != like.device:
            size = numel if stale or buf.dtype != like.dtype else max(numel, buf.numel())
            self._buffer = torch.empty(size, dtype=like.dtype, device=like.device)

    def gather(
        self,
        keys: GatheredKeys,
        key_cache: torch.Tensor,  # [N, B, Hkv, D]
        value_cache: torch.Tensor,  # [N, B, Hkv, D]
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Copy the blocks; returns K and V as [R, Hkv, W * B, D] views, and the mask."""
        rows = keys.blocks.shape[0]
        ids = keys.blocks.flatten()
        shape = (ids.numel(), *key_cache.shape[1:])
        numel = math.prod(shape)
        assert 2 * numel <= self._buffer.numel(), "reserve() the workspace first"
        out_k = self._buffer[:numel].view(shape)
        out_v = self._buffer[numel : 2 * numel].view(shape)
        torch.index_select(key_cache, 0, ids, out=out_k)
        torch.index_select(value_cache, 0, ids, out=out_v)
        heads = key_cache.shape[2:]
        mask = None if keys.mask is None else keys.mask.to(dtype)
        return (
            out_k.view(rows, -1, *heads).transpose(1, 2),
            out_v.view(rows, -1, *heads).transpose(1, 2),
            mask,
        )
