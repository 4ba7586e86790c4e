"""Host swap space: taken as set, else sized from the model, capped by the host, floored.

The 8B figures use ``llama-8b-random``'s config arithmetic (its weights, 15.6 GB, are never
built); the engines are real ``tiny-random`` ones on the CPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine import Engine, EngineConfig, InvalidRequestError
from engine.host_swap import MIN_SWAP_BYTES, HostSwap, SwapSizing, size_host_swap
from engine.presets import get_preset

GIB = 1 << 30
MIB = 1 << 20
BLOCK = 16
LLAMA_8B = get_preset("llama-8b-random").config
BF16_BLOCK = LLAMA_8B.kv_bytes_per_token(torch.bfloat16) * BLOCK  # 2 MiB: 128 KiB a token


def _llama_8b(
    config: EngineConfig | None = None, *, host: int = 64 * GIB, context: int | None = None
) -> HostSwap:
    return size_host_swap(
        config or EngineConfig(model="llama-8b-random"),
        bytes_per_block=BF16_BLOCK,
        max_model_len=context or LLAMA_8B.max_position_embeddings,
        host_available_bytes=host,
    )


def test_an_8b_model_gets_room_for_two_16k_token_agents() -> None:
    swap = _llama_8b()
    assert swap.sizing is SwapSizing.MODEL
    assert swap.num_blocks >= 16_384 // BLOCK  # one 16k-token context, at the least
    assert (swap.num_tokens, swap.nbytes) == (32_768, 4 * GIB)  # vLLM's default swap space
    # The former fixed 64 MiB held 32 of these blocks: 512 tokens, not one 3k-token agent.
    assert MIN_SWAP_BYTES // BF16_BLOCK == 32
    assert "sized from the model: 32,768 tokens" in swap.describe()


def test_a_context_longer_than_32k_tokens_fits_whole() -> None:
    swap = _llama_8b(context=131_072)
    assert swap.num_tokens == 131_072 and swap.nbytes == 16 * GIB


def test_the_host_caps_it_at_a_quarter_of_its_available_memory() -> None:
    swap = _llama_8b(host=8 * GIB)
    assert swap.nbytes == 2 * GIB and swap.num_tokens == 16_384
    assert "capped at 0.25 of the host's 8.0 GiB available" in swap.reason


def test_it_is_never_under_the_former_64_mib() -> None:
    small_host = _llama_8b(host=100 * MIB)
    assert small_host.nbytes == MIN_SWAP_BYTES and "64 MiB floor" in small_host.reason
    tiny = get_preset("tiny-random").config
    tiny_block = tiny.kv_bytes_per_token(torch.bfloat16) * BLOCK  # 32,768 tokens: 32 MiB
    swap = size_host_swap(
        EngineConfig(),
        bytes_per_block=tiny_block,
        max_model_len=tiny.max_position_embeddings,
        host_available_bytes=64 * GIB,
    )
    assert swap.nbytes == MIN_SWAP_BYTES and swap.num_tokens == 65_536


@pytest.mark.parametrize(
    ("settings", "num_blocks", "sizing"),
    [
        ({"swap_space_bytes": MIB}, 0, SwapSizing.BYTES),  # less than one 2 MiB block
        ({"swap_space_bytes": 100 * MIB}, 50, SwapSizing.BYTES),
        ({"swap_space_bytes": 0}, 0, SwapSizing.BYTES),
        ({"swap_space_blocks": 5, "swap_space_bytes": 100 * MIB}, 5, SwapSizing.BLOCKS),
    ],
)
def test_a_setting_is_taken_exactly_whatever_the_host(
    settings: dict[str, Any], num_blocks: int, sizing: SwapSizing
) -> None:
    config = EngineConfig(model="llama-8b-random", **settings)
    for host in (100 * MIB, 64 * GIB):
        swap = _llama_8b(config, host=host)
        assert (swap.num_blocks, swap.sizing) == (num_blocks, sizing)
        assert swap.reason.startswith(f"set: {sizing.value}")


def test_the_engine_sizes_its_host_pool_by_the_rule_or_the_setting() -> None:
    engine = Engine(EngineConfig(num_blocks=16))
    bytes_per_block = engine.capacity().bytes_per_block  # float32 on the CPU: 32 KiB
    # tiny-random's 32,768-token context in float32 is 64 MiB: the pool it always had.
    assert engine.host_swap.sizing is SwapSizing.MODEL
    assert engine.capacity().num_host_blocks == engine.kv_cache.num_host_blocks
    assert engine.kv_cache.num_host_blocks == MIN_SWAP_BYTES // bytes_per_block == 2048
    engine = Engine(EngineConfig(num_blocks=16, swap_space_bytes=MIB))
    assert engine.host_swap.sizing is SwapSizing.BYTES
    assert engine.kv_cache.num_host_blocks == MIB // bytes_per_block == 32


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_swap_space_bytes_must_be_a_whole_number_of_bytes(value: object) -> None:
    with pytest.raises(InvalidRequestError, match="swap_space_bytes must be an int >= 0"):
        EngineConfig(swap_space_bytes=value)  # type: ignore[arg-type]
