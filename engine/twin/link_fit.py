"""A device's host link fitted from timed copies on the real engine.

``measure_link(engine)`` retains a context of each size, then times its offload to host
memory and its restore (each copy waited for), ``repeats`` times; a sample is the median
of one size and direction. ``fit_link(samples)`` fits ``latency + bytes / bandwidth``
to them by least squares, the model ``HostLink`` charges. On a CPU the link is a memcpy
plus the engine's own bookkeeping of a swap, which no specification publishes: the
``cpu-here`` profile's link figures are fitted so (``kvgov twin fit``, ``kvgov twin
check``). Every budget and block the measurement takes is given back.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.engine import Engine
from engine.sampling import SamplingParams

__all__ = ["LinkFit", "LinkSample", "fit_link", "measure_link"]

DEFAULT_SIZES = (8, 32, 128)  # blocks a copy moves


@dataclass(frozen=True, slots=True)
class LinkSample:
    num_bytes: int
    seconds: float  # the median copy of this size


@dataclass(frozen=True, slots=True)
class LinkFit:
    bandwidth_bytes_s: float
    latency_s: float


def measure_link(
    engine: Engine, *, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 5
) -> list[LinkSample]:
    """Median copy times of contexts of ``sizes`` blocks, out and back, on ``engine``."""
    block_size = engine.config.block_size
    bytes_per_block = engine.capacity().bytes_per_block
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    samples: list[LinkSample] = []
    for num_blocks in sizes:
        budget = f"twin-link-{num_blocks}"
        engine.open_budget(budget, engine.capacity().num_blocks)
        try:
            prompt = [(i * 7919 + num_blocks) % 50_000 + 1 for i in range(num_blocks * block_size)]
            engine.generate(prompt, greedy, budget=budget)
            engine.retain(budget)
            outs, ins = [], []
            for _ in range(repeats):
                outs.append(_timed(engine, functools.partial(engine.offload, budget=budget)))
                ins.append(_timed(engine, functools.partial(engine.restore, budget=budget)))
        finally:
            engine.close_budget(budget)
        copied = num_blocks * bytes_per_block
        samples.append(LinkSample(copied, statistics.median(outs)))
        samples.append(LinkSample(copied, statistics.median(ins)))
    engine.reset_prefix_cache()
    return samples


def _timed(engine: Engine, copy: Callable[[], None]) -> float:
    started = time.perf_counter()
    copy()
    engine.kv_cache.synchronize()
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return time.perf_counter() - started


def fit_link(samples: Sequence[LinkSample]) -> LinkFit:
    """``seconds = latency + bytes / bandwidth`` by least squares over ``samples`` (at least
    two sizes); a negative intercept is held at 0 and the slope refitted through it."""
    sizes = {s.num_bytes for s in samples}
    if len(sizes) < 2:
        raise ValueError("fitting a link takes copies of at least two sizes")
    mean_x = statistics.fmean(s.num_bytes for s in samples)
    mean_y = statistics.fmean(s.seconds for s in samples)
    sxx = sum((s.num_bytes - mean_x) ** 2 for s in samples)
    slope = sum((s.num_bytes - mean_x) * (s.seconds - mean_y) for s in samples) / sxx
    latency = mean_y - slope * mean_x
    if latency < 0 or slope <= 0:
        latency = 0.0
        slope = sum(s.num_bytes * s.seconds for s in samples) / sum(s.num_bytes**2 for s in samples)
    return LinkFit(bandwidth_bytes_s=1.0 / slope, latency_s=latency)
