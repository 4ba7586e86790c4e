"""``offload_gb_per_s`` and ``restore_gb_per_s``: a parked agent's KV to host memory, and back.

One agent's 4,096-token context (prompt plus reply) is held between calls
(``Backend.retain``) on the bundled engine, then offloaded to host memory and restored,
as the governor does under pressure. Between the two, a flood request of other traffic
takes every device block, so none of the context's device copies survives in the prefix
cache and the restore copies every held block back from the host (checked each time
from the engine's counts: the flood's own blocks fill the cache). Each figure is the
bytes one call copies over its time through the whole path (``LocalBackend`` -> engine
thread -> block moves -> K/V copies), median of the repeats. On a CPU both sides are
host memory; on a GPU they are the device-to-host and host-to-device PCIe copies.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from backends import LocalBackend
from governor import Backend, GenerationRequest

__all__ = ["BLOCK_SIZE", "CONTEXT_TOKENS", "OffloadRun", "engine_config", "measure", "run"]

_BENCH = "policies"
CONTEXT_TOKENS = 4_096
BLOCK_SIZE = 16


def engine_config(context_tokens: int = CONTEXT_TOKENS) -> Mapping[str, object]:
    """The engine ``measure`` runs on: room for the context and a little slack."""
    num_blocks = context_tokens // BLOCK_SIZE + 8
    return {
        "num_blocks": num_blocks,
        "block_size": BLOCK_SIZE,
        "swap_space_bytes": 256 << 20,
        "max_model_len": num_blocks * BLOCK_SIZE,
    }


_VOCAB = 50_000  # ids well inside cl100k and the tiny model's vocabulary


@dataclass(frozen=True, slots=True)
class OffloadRun:
    num_held_blocks: int
    bytes_per_block: int
    offload_s: list[float]  # one per repeat
    restore_s: list[float]

    @property
    def num_bytes(self) -> int:
        """Bytes each call copies: every held block, each way."""
        return self.num_held_blocks * self.bytes_per_block


def measure(backend: Backend, *, repeats: int, context_tokens: int = CONTEXT_TOKENS) -> OffloadRun:
    """Hold one context, then offload it, flood the device and restore it ``repeats``
    times on ``backend`` (an engine built from ``engine_config(context_tokens)``)."""
    cap = backend.capacity()
    prompt = [(i * 7_919) % _VOCAB for i in range(context_tokens)]
    backend.open_budget("agent", max_blocks=context_tokens // BLOCK_SIZE + 1)
    backend.generate(GenerationRequest(prompt=prompt, max_tokens=1, budget="agent"))
    held = backend.retain(budget="agent") // BLOCK_SIZE
    if held != context_tokens // BLOCK_SIZE:
        raise RuntimeError(f"held {held} blocks of the {context_tokens:,}-token context")
    # The flood fills every block (its sampled token lands in the last free slot), so
    # nothing the context left in the prefix cache survives it.
    flood_tokens = cap.num_blocks * BLOCK_SIZE - 1
    offload_s, restore_s = [], []
    for repeat in range(repeats):
        start = time.perf_counter()
        backend.offload(budget="agent")
        offload_s.append(time.perf_counter() - start)
        flood = [(i * 104_729 + repeat + 1) % _VOCAB for i in range(flood_tokens)]
        backend.generate(GenerationRequest(prompt=flood, max_tokens=1))
        after_flood = backend.metrics()
        if after_flood.num_blocks_cached != flood_tokens // BLOCK_SIZE:
            raise RuntimeError(
                f"{after_flood.num_blocks_cached} cached blocks after the flood, not its own "
                f"{flood_tokens // BLOCK_SIZE}: device copies of the context may survive"
            )
        start = time.perf_counter()
        backend.restore(budget="agent")
        restore_s.append(time.perf_counter() - start)
        restored = backend.metrics()
        if restored.num_blocks_in_use != held or restored.num_blocks_swapped:
            raise RuntimeError(
                f"after the restore {restored.num_blocks_in_use} blocks are in use and "
                f"{restored.num_blocks_swapped} still on the host, for {held} held"
            )
    backend.close_budget("agent")
    return OffloadRun(
        num_held_blocks=held,
        bytes_per_block=cap.bytes_per_block,
        offload_s=offload_s,
        restore_s=restore_s,
    )


def run(*, quick: bool = False) -> Iterator[Mapping[str, object]]:
    repeats = 2 if quick else 5
    backend = LocalBackend(config=engine_config())
    try:
        result = measure(backend, repeats=repeats)
    finally:
        backend.close()
    mib = result.num_bytes / 2**20
    what = (
        f"{result.num_held_blocks * BLOCK_SIZE:,}-token context, {result.num_held_blocks} "
        f"blocks, {mib:.1f} MiB (tiny-random, {result.bytes_per_block // BLOCK_SIZE:,} B/token)"
    )
    for metric, times, how in (
        ("offload_gb_per_s", result.offload_s, "device to host"),
        (
            "restore_gb_per_s",
            result.restore_s,
            "host to device, every block copied back: a flood took every device block first",
        ),
    ):
        yield {
            "bench": _BENCH,
            "metric": metric,
            "value": statistics.median(result.num_bytes / t / 1e9 for t in times),
            "unit": "GB/s",
            "target": None,
            "direction": "higher",
            "note": f"{what}, {how}; median of {repeats}",
        }
