"""Sizing the KV pool on a GPU by profiling: what a full step peaks at, then the rest.

On CUDA and ROCm, with no size given in ``EngineConfig``, the engine runs dummy steps
at its largest shapes (``max_num_batched_tokens`` prompt tokens as one chunk, then
spread over up to ``max_num_seqs`` sequences with the logits of one row per sequence),
reads the allocator's peak, returns the step's memory with ``empty_cache`` and gives the KV pool

    kv_bytes = gpu_memory_utilization x total - (used before the step + the step's peak)

where "used before" is everything the device already holds (the weights, the CUDA
context, other processes: ``total - free``) and the step's peak is the most the
allocator held above its level before the step. So activations, the attention workspace
and the logits of the largest step are paid for before the KV pool takes the rest. The
allocator runs with ``expandable_segments`` where the build has them
(``engine.expandable_segments``) so the pool and the step's buffers do not fragment it;
the figure is logged at startup.

The device calls go through ``DeviceMemory`` so the arithmetic is tested on a CPU with
a fake device (``tests/engine/test_memory_profile.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.attention.metadata import AttentionMetadata
from engine.config import EngineConfig
from engine.errors import InvalidRequestError
from engine.kv_cache import KVCache
from engine.models.llama import LlamaForCausalLM

__all__ = [
    "CudaMemory",
    "DeviceMemory",
    "MemoryProfile",
    "profile_kv_bytes",
    "profile_largest_step",
    "run_largest_step",
]

logger = logging.getLogger(__name__)


class DeviceMemory(Protocol):
    def mem_get_info(self) -> tuple[int, int]: ...  # (free, total) bytes of the device
    def memory_allocated(self) -> int: ...
    def max_memory_allocated(self) -> int: ...
    def reset_peak_memory_stats(self) -> None: ...
    def synchronize(self) -> None: ...
    def empty_cache(self) -> None: ...


@dataclass(frozen=True, slots=True)
class CudaMemory:
    """``DeviceMemory`` of one CUDA/ROCm device."""

    device: torch.device

    def mem_get_info(self) -> tuple[int, int]:
        return torch.cuda.mem_get_info(self.device)

    def memory_allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def max_memory_allocated(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def reset_peak_memory_stats(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()


@dataclass(frozen=True, slots=True)
class MemoryProfile:
    total_bytes: int
    used_before_bytes: int  # total - free before the dummy step: weights, context, others
    step_peak_bytes: int  # the most the allocator held above its level before the step
    utilization: float

    @property
    def peak_bytes(self) -> int:
        return self.used_before_bytes + self.step_peak_bytes

    @property
    def kv_bytes(self) -> int:
        return int(self.utilization * self.total_bytes) - self.peak_bytes

    def describe(self) -> str:
        gib = 1 << 30
        return (
            f"KV cache by profiling: {self.utilization:g} x {self.total_bytes / gib:.2f} GiB "
            f"- {self.used_before_bytes / gib:.2f} GiB in use - {self.step_peak_bytes / gib:.2f} "
            f"GiB peak of the largest step = {self.kv_bytes / gib:.2f} GiB"
        )


def profile_kv_bytes(
    run_largest_step: Callable[[], None], *, memory: DeviceMemory, utilization: float
) -> MemoryProfile:
    """Run the step, measure, release its memory; refuse when nothing is left for KV."""
    memory.empty_cache()
    memory.synchronize()
    free, total = memory.mem_get_info()
    before = memory.memory_allocated()
    memory.reset_peak_memory_stats()
    run_largest_step()
    memory.synchronize()
    step_peak = max(0, memory.max_memory_allocated() - before)
    memory.empty_cache()  # the step's blocks go back to the device, for the KV pool
    profile = MemoryProfile(
        total_bytes=total,
        used_before_bytes=total - free,
        step_peak_bytes=step_peak,
        utilization=utilization,
    )
    logger.info(profile.describe())
    if profile.kv_bytes <= 0:
        raise InvalidRequestError(
            f"no memory is left for the KV cache: {profile.describe()}; raise "
            "gpu_memory_utilization, lower max_num_batched_tokens or max_num_seqs, quantize "
            "the weights (quantize='int4'), or free the device"
        )
    return profile


def run_largest_step(
    model: LlamaForCausalLM, *, num_tokens: int, num_seqs: int, block_size: int
) -> None:
    """The engine's largest steps, each on a KV cache of its own (freed on return; its
    bytes count in the peak, a small overcount): ``num_tokens`` prompt tokens as one
    chunk (the largest attention), then spread over ``min(num_seqs, num_tokens)``
    sequences with the logits of each one's last token (the largest logits)."""
    _prefill(model, [num_tokens], block_size)
    num_seqs = min(num_seqs, num_tokens)
    if num_seqs > 1:
        lens = [num_tokens // num_seqs + (i < num_tokens % num_seqs) for i in range(num_seqs)]
        _prefill(model, lens, block_size)


def _prefill(model: LlamaForCausalLM, lens: list[int], block_size: int) -> None:
    config, device = model.config, model.device
    tables: list[list[int]] = []
    for n in lens:
        first = sum(len(t) for t in tables)
        tables.append(list(range(first, first + -(-n // block_size))))
    cache = KVCache(
        num_layers=config.num_layers,
        num_blocks=sum(len(t) for t in tables),
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        block_size=block_size,
        dtype=model.dtype,
        device=device,
    )
    metadata = AttentionMetadata.build(
        block_size=block_size, query_lens=lens, seq_lens=lens, block_tables=tables, device=device
    )
    with torch.inference_mode():
        model.attention.prepare(metadata)
        tokens = torch.zeros(sum(lens), dtype=torch.int64, device=device)
        positions = torch.cat([torch.arange(n, device=device) for n in lens])
        hidden = model(tokens, positions, cache, metadata)  # [T, H]
        model.compute_logits(hidden[metadata.query_start_loc[1:] - 1])  # [S, V]


def profile_largest_step(model: LlamaForCausalLM, config: EngineConfig) -> MemoryProfile:
    """``profile_kv_bytes`` of ``run_largest_step`` on the model's CUDA/ROCm device."""
    return profile_kv_bytes(
        lambda: run_largest_step(
            model,
            num_tokens=config.max_num_batched_tokens,
            num_seqs=config.max_num_seqs,
            block_size=config.block_size,
        ),
        memory=CudaMemory(model.device),
        utilization=config.gpu_memory_utilization,
    )
