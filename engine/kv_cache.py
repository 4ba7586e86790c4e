"""The physical K/V storage of the paged cache: one device pool and one host pool.

Layout (L layers, N device blocks, Nh host blocks, B token slots per block,
H kv heads, D head dim)::

    kv           [2, L, N,  B, H, D]   on the device; kv[0] holds keys, kv[1] values
    host_blocks  [Nh, 2, L, B, H, D]   on the host (pinned on CUDA/ROCm), block-major
    host_kv      [2, L, Nh, B, H, D]   a view of ``host_blocks`` in the device's order

A move takes ``(src, dst)`` pairs and reads every source before it writes any destination;
destinations are distinct, sources left untouched. On CUDA/ROCm swaps run on a side
stream and never block the host: code that reads ``host_kv`` calls ``synchronize()``
first. Bad ids raise :class:`~engine.errors.InvalidRequestError`. Why this layout, and
the moves in full: docs/design/engine-step.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.device import default_dtype, resolve_device
from engine.errors import InvalidRequestError
from engine.host_staging import stage_tensor
from engine.validation import require_int

__all__ = ["BlockPairs", "KVCache"]

BlockPairs = Sequence[tuple[int, int]] | torch.Tensor


def _block_bytes(
    *, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype.itemsize


class KVCache:
    """Paged K/V storage; see the module docstring for layout and move semantics."""

    __slots__ = (
        "_pinned",
        "_stream",
        "block_size",
        "device",
        "dtype",
        "head_dim",
        "host_blocks",
        "key_caches",
        "kv",
        "num_blocks",
        "num_host_blocks",
        "num_kv_heads",
        "num_layers",
        "value_caches",
    )

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int = 16,
        num_host_blocks: int = 0,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "auto",
    ) -> None:
        self.num_layers = require_int("num_layers", num_layers, minimum=1)
        self.num_blocks = require_int("num_blocks", num_blocks, minimum=1)
        self.block_size = require_int("block_size", block_size, minimum=1)
        self.num_kv_heads = require_int("num_kv_heads", num_kv_heads, minimum=1)
        self.head_dim = require_int("head_dim", head_dim, minimum=1)
        self.num_host_blocks = require_int("num_host_blocks", num_host_blocks, minimum=0)
        self.device = resolve_device(device)
        self.dtype = _check_dtype(default_dtype(self.device) if dtype is None else dtype)
        # Pinned host memory lets copies run asynchronously on CUDA/ROCm, on their own stream.
        self._pinned = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self._pinned else None

        block = (self.block_size, self.num_kv_heads, self.head_dim)
        # Zeros, not empty: masked-out slots must never hold NaN/inf garbage.
        self.kv = torch.zeros(  # [2, L, N, B, H, D]
            (2, self.num_layers, self.num_blocks, *block), dtype=self.dtype, device=self.device
        )
        self.host_blocks = torch.zeros(  # [Nh, 2, L, B, H, D]
            (self.num_host_blocks, 2, self.num_layers, *block),
            dtype=self.dtype,
            pin_memory=self._pinned,
        )
        self.key_caches: tuple[torch.Tensor, ...] = tuple(self.kv[0].unbind(0))  # L x [N, B, H, D]
        self.value_caches: tuple[torch.Tensor, ...] = tuple(self.kv[1].unbind(0))

    def __repr__(self) -> str:
        return (
            f"KVCache(num_layers={self.num_layers}, num_blocks={self.num_blocks}, "
            f"block_size={self.block_size}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, num_host_blocks={self.num_host_blocks}, "
            f"dtype={self.dtype}, device={self.device})"
        )

    @property
    def host_kv(self) -> torch.Tensor:  # [2, L, Nh, B, H, D], a view of host_blocks
        return self.host_blocks.permute(1, 2, 0, 3, 4, 5)

    def synchronize(self) -> None:
        """Wait for the side stream's copies (a no-op on a CPU)."""
        if self._stream is not None:
            self._stream.synchronize()

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block across every layer."""
        return _block_bytes(
            num_layers=self.num_layers,
            block_size=self.block_size,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=self.dtype,
        )

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block // self.block_size

    @staticmethod
    def blocks_for_bytes(
        nbytes: int,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int = 16,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "auto",
    ) -> int:
        """How many whole blocks fit in ``nbytes`` (may be 0); dtype defaults as in ``KVCache``."""
        require_int("nbytes", nbytes, minimum=0)
        resolved = _check_dtype(default_dtype(device) if dtype is None else dtype)
        return nbytes // _block_bytes(
            num_layers=require_int("num_layers", num_layers, minimum=1),
            block_size=require_int("block_size", block_size, minimum=1),
            num_kv_heads=require_int("num_kv_heads", num_kv_heads, minimum=1),
            head_dim=require_int("head_dim", head_dim, minimum=1),
            dtype=resolved,
        )

    def key_cache(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s keys, ``[N, B, H, D]``; a view, so writes land in the cache."""
        return self.key_caches[self._layer(layer)]

    def value_cache(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s values, ``[N, B, H, D]``; a view, so writes land in the cache."""
        return self.value_caches[self._layer(layer)]

    def copy_blocks(self, pairs: BlockPairs) -> None:
        """Copy device block ``src`` to device block ``dst`` in every layer (copy-on-write)."""
        ids = self._pairs(pairs, "copy_blocks", src_pool="device", dst_pool="device")
        if ids is None:
            return
        # Non-blocking: copy-on-write happens mid-step, and a blocking copy of the ids
        # would make the host wait for the device.
        src, dst = (stage_tensor(t, self.device) for t in ids)
        # index_select returns a fresh tensor: all sources are read before any write.
        self.kv.index_copy_(2, dst, self.kv.index_select(2, src))

    def swap_out(self, pairs: BlockPairs) -> None:
        """Copy device block ``src`` to host block ``dst``, in every layer."""
        ids = self._pairs(pairs, "swap_out", src_pool="device", dst_pool="host")
        if ids is None:
            return
        src, dst = ids
        if self._stream is None:
            gathered = self.kv.index_select(2, src)  # [2, L, n, B, H, D]
            self.host_blocks.index_copy_(0, dst, gathered.permute(2, 0, 1, 3, 4, 5))
            return
        compute, side = torch.cuda.current_stream(self.device), self._stream
        side.wait_stream(compute)  # the blocks' K/V are written
        with torch.cuda.stream(side):
            index = stage_tensor(src, self.device)
            # [n, 2, L, B, H, D]; allocated on the side stream, which alone uses it
            staged = self.kv.index_select(2, index).permute(2, 0, 1, 3, 4, 5).contiguous()
            gathered = side.record_event()
            for row, first, count in _runs(dst.tolist()):
                self.host_blocks[first : first + count].copy_(
                    staged[row : row + count], non_blocking=True
                )
        compute.wait_event(gathered)  # the source blocks may be reused from here on

    def swap_in(self, pairs: BlockPairs) -> None:
        """Copy host block ``src`` to device block ``dst``, in every layer."""
        ids = self._pairs(pairs, "swap_in", src_pool="host", dst_pool="device")
        if ids is None:
            return
        src, dst = ids
        if self._stream is None:
            moved = self.host_blocks.index_select(0, src)  # [n, 2, L, B, H, D]
            self.kv.index_copy_(2, dst, moved.permute(1, 2, 0, 3, 4, 5))
            return
        compute, side = torch.cuda.current_stream(self.device), self._stream
        with torch.cuda.stream(side):  # after any swap_out still copying to these blocks
            staged = torch.empty(
                (src.numel(), *self.host_blocks.shape[1:]), dtype=self.dtype, device=self.device
            )
            for row, first, count in _runs(src.tolist()):
                staged[row : row + count].copy_(
                    self.host_blocks[first : first + count], non_blocking=True
                )
            arrived = side.record_event()
        compute.wait_event(arrived)
        staged.record_stream(compute)  # read below, on the compute stream
        index = stage_tensor(dst, self.device)
        self.kv.index_copy_(2, index, staged.permute(1, 2, 0, 3, 4, 5))

    def _layer(self, layer: int) -> int:
        is_int = isinstance(layer, int) and not isinstance(layer, bool)
        if not is_int or not 0 <= layer < self.num_layers:
            raise InvalidRequestError(
                f"layer must be an int in 0..{self.num_layers - 1}, got {layer!r}"
            )
        return layer

    def _pairs(
        self, pairs: BlockPairs, op: str, *, src_pool: str, dst_pool: str
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Validated ``(src, dst)`` int64 CPU index tensors, or None when there is nothing to do."""
        if isinstance(pairs, torch.Tensor):
            ids = pairs.detach().to("cpu")
        elif len(pairs) == 0:
            return None
        else:
            try:
                ids = torch.as_tensor(pairs)
            except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
                raise InvalidRequestError(
                    f"{op}: pairs must be (src, dst) tuples of ints, got {pairs!r}"
                ) from exc
        if ids.numel() == 0:
            return None
        if ids.ndim != 2 or ids.shape[1] != 2:
            raise InvalidRequestError(
                f"{op}: pairs must have shape [n, 2] (src, dst), got {tuple(ids.shape)}"
            )
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise InvalidRequestError(f"{op}: block ids must be integers, got dtype {ids.dtype}")
        ids = ids.to(torch.int64)
        src, dst = ids[:, 0].contiguous(), ids[:, 1].contiguous()
        sizes = {"device": self.num_blocks, "host": self.num_host_blocks}
        _check_range(op, "source", src_pool, src, sizes[src_pool])
        _check_range(op, "destination", dst_pool, dst, sizes[dst_pool])
        if torch.unique(dst).numel() != dst.numel():
            ordered = dst.sort().values
            dup = int(ordered[1:][ordered[1:] == ordered[:-1]][0])
            raise InvalidRequestError(
                f"{op}: destination {dst_pool} block {dup} appears more than once; "
                "each destination may be written by only one pair"
            )
        return src, dst


def _check_dtype(dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidRequestError(
            f"dtype must be a floating-point torch.dtype such as torch.float16, got {dtype!r}"
        )
    return dtype


def _check_range(op: str, role: str, pool: str, ids: torch.Tensor, limit: int) -> None:
    bad = (ids < 0) | (ids >= limit)
    if not bool(bad.any()):
        return
    if limit == 0:
        raise InvalidRequestError(
            f"{op}: there are no {pool} blocks; build the KVCache with num_host_blocks > 0"
        )
    raise InvalidRequestError(
        f"{op}: {role} {pool} block id {int(ids[bad][0])} is out of range; valid ids are "
        f"0..{limit - 1}; use ids handed out by the block manager"
    )


def _runs(ids: list[int]) -> list[tuple[int, int, int]]:
    """``(row, first id, count)`` for each run of consecutive ids, in order: one copy each."""
    runs: list[tuple[int, int, int]] = []
    for row, block in enumerate(ids):
        if runs and runs[-1][1] + runs[-1][2] == block:
            first_row, first, count = runs[-1]
            runs[-1] = (first_row, first, count + 1)
        else:
            runs.append((row, block, 1))
    return runs
