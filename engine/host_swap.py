"""Host swap space: how many blocks of host memory hold swapped and offloaded KV, and why.

Set by the caller, it is taken exactly: ``swap_space_blocks`` blocks, else
``swap_space_bytes // bytes_per_block`` (0: no host swap). Left unset, it is sized from
the model, as vLLM's ``--swap-space`` (4 GiB per GPU) is meant to be, but in tokens, so
that a small model does not take gigabytes of host memory and a large one gets room
for its agents:

    tokens = max(32,768, max_model_len)     two 16k-token agents, or one at the full context
    bytes  = tokens x KV bytes per token    4 GiB for an 8B model in bf16 (128 KiB a token)
    capped at a quarter of the host's available memory, and never under 64 MiB

The floor is the former fixed default, so a small model (``tiny-random``: 32,768
tokens in float32 are 64 MiB) keeps the host pool it had. The host pool is allocated
at startup, pinned on CUDA/ROCm (``engine.kv_cache``), so its size is what the host
gives up for the engine's life.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from engine.config import EngineConfig

__all__ = [
    "DEFAULT_SWAP_TOKENS",
    "HOST_MEMORY_SHARE",
    "MIN_SWAP_BYTES",
    "HostSwap",
    "SwapSizing",
    "size_host_swap",
]

logger = logging.getLogger(__name__)

DEFAULT_SWAP_TOKENS = 32_768  # two 16k-token agents parked at once (DESIGN's reference agent)
HOST_MEMORY_SHARE = 0.25  # of MemAvailable: the rest stays the host's (and a CPU engine's)
MIN_SWAP_BYTES = 64 << 20  # the fixed default before host swap was sized from the model

_MIB = 1 << 20


class SwapSizing(Enum):
    BLOCKS = "swap_space_blocks"  # set in blocks
    BYTES = "swap_space_bytes"  # set in bytes
    MODEL = "model"  # neither set: sized from the model


@dataclass(frozen=True, slots=True)
class HostSwap:
    num_blocks: int
    block_size: int
    bytes_per_block: int
    sizing: SwapSizing
    reason: str  # why this size, in words

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    def describe(self) -> str:
        return (
            f"host swap: {self.num_blocks:,} blocks of {self.block_size} tokens = "
            f"{self.num_tokens:,} tokens, {self.nbytes / _MIB:,.1f} MiB ({self.reason})"
        )


def size_host_swap(
    config: EngineConfig, *, bytes_per_block: int, max_model_len: int, host_available_bytes: int
) -> HostSwap:
    """The host pool for ``config``: as set, else sized from the model (the module's rule)
    with ``host_available_bytes`` the host's available memory now."""
    block_size = config.block_size

    def swap(num_blocks: int, sizing: SwapSizing, reason: str) -> HostSwap:
        return HostSwap(
            num_blocks=num_blocks,
            block_size=block_size,
            bytes_per_block=bytes_per_block,
            sizing=sizing,
            reason=reason,
        )

    if config.swap_space_blocks is not None:
        return swap(config.swap_space_blocks, SwapSizing.BLOCKS, "set: swap_space_blocks")
    if config.swap_space_bytes is not None:
        return swap(
            config.swap_space_bytes // bytes_per_block,
            SwapSizing.BYTES,
            f"set: swap_space_bytes, {config.swap_space_bytes / _MIB:,.1f} MiB",
        )
    tokens = max(DEFAULT_SWAP_TOKENS, max_model_len)
    num_blocks = -(-tokens // block_size)
    reason = (
        f"sized from the model: {tokens:,} tokens, the larger of {DEFAULT_SWAP_TOKENS:,} and "
        f"its context, at {bytes_per_block // block_size:,} bytes a token"
    )
    cap = int(HOST_MEMORY_SHARE * host_available_bytes) // bytes_per_block
    if num_blocks > cap:
        num_blocks = cap
        reason += (
            f", capped at {HOST_MEMORY_SHARE:g} of the host's "
            f"{host_available_bytes / (1 << 30):,.1f} GiB available"
        )
    floor = MIN_SWAP_BYTES // bytes_per_block  # as the former default divided it
    if num_blocks < floor:
        num_blocks = floor
        reason += f", raised to the {MIN_SWAP_BYTES // _MIB} MiB floor"
    host_swap = swap(num_blocks, SwapSizing.MODEL, reason)
    logger.info(host_swap.describe())
    return host_swap
