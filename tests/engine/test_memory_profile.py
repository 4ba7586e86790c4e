"""KV sizing by profiling: the arithmetic, with the device's memory calls faked.

``FakeMemory`` stands in for ``torch.cuda``'s allocator statistics because this suite
runs without a GPU: it keeps the counters a caching allocator keeps (allocated, peak,
reserved) and records the order of the calls. ``run_largest_step`` itself runs for real
on the CPU with the tiny model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest
import torch

from engine import EngineConfig, InvalidRequestError
from engine.attention import ReferenceAttention
from engine.loader import num_kv_blocks
from engine.memory_profile import MemoryProfile, profile_kv_bytes, run_largest_step
from engine.presets import build_preset_model

GIB = 1 << 30


@dataclass
class FakeMemory:
    total: int = 16 * GIB
    used_by_others: int = 0  # memory outside this allocator: context, other processes
    allocated: int = 0
    reserved: int = 0
    peak: int = 0
    calls: list[str] = field(default_factory=list)

    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.reserved = max(self.reserved, self.allocated)
        self.peak = max(self.peak, self.allocated)

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes  # stays reserved until empty_cache

    def mem_get_info(self) -> tuple[int, int]:
        self.calls.append("mem_get_info")
        return self.total - self.used_by_others - self.reserved, self.total

    def memory_allocated(self) -> int:
        return self.allocated

    def max_memory_allocated(self) -> int:
        return self.peak

    def reset_peak_memory_stats(self) -> None:
        self.calls.append("reset_peak")
        self.peak = self.allocated

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")
        self.reserved = self.allocated


def test_kv_is_utilization_of_the_total_less_what_is_used_and_the_step_peak(
    caplog: pytest.LogCaptureFixture,
) -> None:
    memory = FakeMemory(used_by_others=GIB // 2)
    memory.alloc(5 * GIB)  # the weights
    memory.alloc(GIB)  # a leftover of loading, cached but no longer used
    memory.free(GIB)

    def step() -> None:
        memory.calls.append("step")
        memory.alloc(GIB)  # activations
        memory.alloc(GIB // 2)  # logits, while the activations are alive: peak 1.5 GiB
        memory.free(GIB + GIB // 2)

    with caplog.at_level(logging.INFO, logger="engine.memory_profile"):
        profile = profile_kv_bytes(step, memory=memory, utilization=0.9)
    assert caplog.messages == [profile.describe()]  # the figure, logged at startup
    assert "0.9 x 16.00 GiB - 5.50 GiB in use - 1.50 GiB peak" in profile.describe()
    # The cached leftover was returned before measuring, so it is not counted as in use.
    assert profile.used_before_bytes == 5 * GIB + GIB // 2
    assert profile.step_peak_bytes == GIB + GIB // 2
    assert profile.kv_bytes == int(0.9 * 16 * GIB) - 5 * GIB - GIB // 2 - GIB - GIB // 2
    # The peak is reset before the step and the step's memory released after it.
    assert memory.calls.index("reset_peak") < memory.calls.index("step")
    assert memory.calls[-1] == "empty_cache" and memory.reserved == 5 * GIB


def test_nothing_left_for_kv_is_refused_with_what_to_change() -> None:
    memory = FakeMemory()
    memory.alloc(14 * GIB)
    with pytest.raises(InvalidRequestError, match="gpu_memory_utilization"):
        profile_kv_bytes(lambda: memory.alloc(GIB), memory=memory, utilization=0.9)


def test_a_gpu_without_a_configured_size_takes_the_profiled_figure() -> None:
    profile = MemoryProfile(
        total_bytes=16 * GIB, used_before_bytes=6 * GIB, step_peak_bytes=GIB, utilization=0.9
    )
    cuda = torch.device("cuda", 0)  # only its type is read: no GPU is touched
    blocks = num_kv_blocks(
        EngineConfig(), device=cuda, bytes_per_block=1 << 20, profile=lambda: profile
    )
    assert blocks == profile.kv_bytes // (1 << 20) == (int(0.9 * 16 * GIB) - 7 * GIB) >> 20

    def never() -> MemoryProfile:
        raise AssertionError("profiled although the size was given")

    assert (
        num_kv_blocks(EngineConfig(num_blocks=7), device=cuda, bytes_per_block=1, profile=never)
        == 7
    )


def test_the_largest_steps_are_one_whole_chunk_and_every_sequence() -> None:
    model = build_preset_model("tiny-random", attention=ReferenceAttention(), device="cpu")
    seen: list[tuple[int, ...]] = []
    hook = model.register_forward_hook(lambda _m, args, out: seen.append(tuple(out.shape)))
    rows: list[int] = []
    original = model.compute_logits
    model.compute_logits = lambda hidden: rows.append(hidden.shape[0]) or original(hidden)  # type: ignore[method-assign]
    try:
        run_largest_step(model, num_tokens=100, num_seqs=8, block_size=16)
    finally:
        hook.remove()
    assert seen == [(100, model.config.hidden_size)] * 2 and rows == [1, 8]


def test_utilization_must_be_a_share() -> None:
    with pytest.raises(InvalidRequestError, match="share of the card"):
        EngineConfig(gpu_memory_utilization=1.5)
