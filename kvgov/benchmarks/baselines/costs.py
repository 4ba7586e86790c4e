"""What the research baselines price their choices with: a prefill's and a swap's
seconds, measured on the engine before the runs, as their papers profile their GPUs."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine import Engine, SamplingParams

__all__ = ["Costs", "measure_costs"]


@dataclass(frozen=True, slots=True)
class Costs:
    prefill_s_per_token: float  # recomputing a context, per token
    swap_s_per_block: float  # one block to host memory or back


def measure_costs(
    engine: Engine,
    *,
    num_tokens: int = 512,
    now: Callable[[], float] = time.perf_counter,
    wait_for_copies: Callable[[Engine], None] | None = None,
) -> Costs:
    """Time a cold prefill and an offload and restore of its context on ``engine``, on the
    clock ``now``; ``wait_for_copies`` returns once the copies are done (the twin's moves
    its virtual clock to the end of its link's queue, so they cost their modelled time)."""
    wait_for_copies = wait_for_copies or _wait_for_copies
    prompt = [(i * 7919) % 50_000 + 1 for i in range(num_tokens)]
    sampling = SamplingParams(max_tokens=1, temperature=0.0)
    engine.generate(prompt[:64], sampling)  # warm-up, untimed
    engine.open_budget("costs", engine.capacity().num_blocks)
    try:
        started = now()
        engine.generate(prompt, sampling, budget="costs")
        prefill_s = now() - started
        engine.retain("costs")
        started = now()
        engine.offload(budget="costs")
        engine.restore(budget="costs")
        wait_for_copies(engine)  # on a GPU both return once the copies are queued
        num_blocks = num_tokens // engine.config.block_size
        swap_s = (now() - started) / (2 * num_blocks)
    finally:
        engine.close_budget("costs")
        engine.reset_prefix_cache()
    return Costs(prefill_s / num_tokens, swap_s)


def _wait_for_copies(engine: Engine) -> None:
    engine.kv_cache.synchronize()
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
