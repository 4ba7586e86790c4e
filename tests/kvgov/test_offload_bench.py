"""``offload_gb_per_s`` / ``restore_gb_per_s``: the bytes they count are the bytes copied."""

from __future__ import annotations

from backends import LocalBackend
from engine.config import EngineConfig
from engine.engine import Engine
from kvgov.benchmarks.offload import BLOCK_SIZE, engine_config, measure

CONTEXT_TOKENS = 1_024  # the benchmark's 4,096 at a quarter of the cost: the same path


def test_every_held_block_goes_to_the_host_and_comes_back_from_it() -> None:
    engine = Engine(EngineConfig(**engine_config(CONTEXT_TOKENS)))  # type: ignore[arg-type]
    manager = engine.block_manager
    backend = LocalBackend(engine)
    repeats = 2
    try:
        result = measure(backend, repeats=repeats, context_tokens=CONTEXT_TOKENS)
        # The engine thread is idle once measure returns: its counts are final.
        swapped_out, swapped_in = (
            manager.swap_space.num_blocks_swapped_out,
            manager.swap_space.num_blocks_swapped_in,
        )
    finally:
        backend.close()
    held = CONTEXT_TOKENS // BLOCK_SIZE
    assert result.num_held_blocks == held
    assert result.num_bytes == held * engine.kv_cache.bytes_per_block
    assert swapped_out == repeats * held
    # No restore reused a device copy that the flood should have evicted.
    assert swapped_in == repeats * held
    assert len(result.offload_s) == len(result.restore_s) == repeats
