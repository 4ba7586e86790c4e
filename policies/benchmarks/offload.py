"""``offload_restore_gb_per_s``: how fast a parked agent's KV goes to host memory and back.

One agent's 4,096-token context (prompt plus reply) is held between calls
(``Backend.retain``) on the bundled engine, then offloaded to host memory and restored,
as the governor does under pressure. Before each restore, other traffic evicts the
device copies from the prefix cache, so every block really comes back from the host.
The figure is the bytes moved both ways over the time of the two calls, through the
whole path (``LocalBackend`` -> engine thread -> block moves -> K/V copies), median of
the repeats. On a CPU both sides are host memory; on a GPU it is the PCIe round trip.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping

from governor import GenerationRequest, LocalBackend

__all__ = ["offload_restore"]

_BENCH = "policies"
_CONTEXT_TOKENS = 4_096
_BLOCK_SIZE = 16


def offload_restore(*, quick: bool = False) -> Mapping[str, object]:
    repeats = 2 if quick else 5
    blocks = _CONTEXT_TOKENS // _BLOCK_SIZE
    backend = LocalBackend(
        config={
            # the context, plus one flood prompt of the same size, plus slack
            "num_blocks": 2 * blocks + 16,
            "block_size": _BLOCK_SIZE,
            "swap_space_bytes": 256 << 20,
            "max_model_len": 2 * _CONTEXT_TOKENS,
        }
    )
    try:
        cap = backend.capacity()
        vocab = 50_000  # ids well inside cl100k and the tiny model's vocabulary
        prompt = [(i * 7_919) % vocab for i in range(_CONTEXT_TOKENS)]
        backend.open_budget("agent", max_blocks=blocks + 1)
        backend.generate(GenerationRequest(prompt=prompt, max_tokens=1, budget="agent"))
        held = backend.retain(budget="agent")
        moved = 2 * (held // _BLOCK_SIZE) * cap.bytes_per_block
        samples: list[float] = []
        for repeat in range(repeats):
            start = time.perf_counter()
            backend.offload(budget="agent")
            offloaded = time.perf_counter() - start
            flood = [(i * 104_729 + repeat + 1) % vocab for i in range(_CONTEXT_TOKENS)]
            backend.generate(GenerationRequest(prompt=flood, max_tokens=1))
            start = time.perf_counter()
            backend.restore(budget="agent")
            restored = time.perf_counter() - start
            in_use = backend.metrics().num_blocks_in_use
            assert in_use == held // _BLOCK_SIZE, "the restore must bring every block back"
            samples.append(moved / (offloaded + restored) / 1e9)
        backend.close_budget("agent")
    finally:
        backend.close()
    return {
        "bench": _BENCH,
        "metric": "offload_restore_gb_per_s",
        "value": statistics.median(samples),
        "unit": "GB/s",
        "target": None,
        "direction": "higher",
        "note": (
            f"{held:,}-token context, {moved / 2 / 2**20:.1f} MiB each way "
            f"(tiny-random, {cap.bytes_per_block // _BLOCK_SIZE:,} B/token), device copies "
            f"evicted before each restore; median of {repeats}"
        ),
    }
