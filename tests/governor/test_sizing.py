"""governor.sizing: CONTRIBUTING.md's table to the digit, the admission formulas, and KV shapes
read from Hugging Face configs (dicts, files and folders written here)."""

from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from governor import sizing
from governor.errors import ConfigError
from governor.sizing import (
    DEFAULT_SAFETY_FACTOR,
    QWEN3_5_9B,
    KVShape,
    Scheme,
    blocks_per_seq,
    compare_schemes,
    kv_shape_from_hf_config,
    max_ceiling_tokens,
    max_concurrent,
)

MB = 10**6
GB = 10**9
# Exactly 0.14 MB per token at FP16 (2 x 35 x 8 x 125 x 2 bytes): CONTRIBUTING.md's round figure.
DESIGN_SHAPE = KVShape(layers=35, kv_heads=8, head_dim=125, dtype_bytes=2)
DESIGN_WORKLOAD = {
    "kv_budget_bytes": 10 * GB,
    "num_agents": 8,
    "ceiling_tokens": 16_000,
    "average_tokens": 3_000,
}

LLAMA3_8B = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}


def percent(fraction: float) -> int:
    return math.floor(fraction * 100 + 0.5)  # half up, as the table rounds 62.5 to 63


def test_the_design_table_is_reproduced_exactly() -> None:
    assert DESIGN_SHAPE.bytes_per_token == 140_000  # 0.14 MB
    table = compare_schemes(kv_shape=DESIGN_SHAPE, **DESIGN_WORKLOAD)

    # contiguous, reserve 16k: 17.9 GB for 8, does not fit, admits 4.
    row = table.contiguous_ceiling
    assert row.scheme is Scheme.CONTIGUOUS_CEILING
    assert row.reserve_tokens == row.cap_tokens == 16_000
    assert row.reserved_bytes == 17_920_000_000 and round(row.reserved_bytes / GB, 1) == 17.9
    assert 16_000 * DESIGN_SHAPE.bytes_per_token == 2_240_000_000  # 2.24 GB per slot
    assert not row.fits and row.agents_admitted == 4 and row.max_concurrent == 4

    # contiguous, reserve 8k: 9.0 GB, fits, 8k hard cap, 63% waste at a 3k average.
    row = table.contiguous_cap
    assert row.scheme is Scheme.CONTIGUOUS_CAP
    assert row.reserve_tokens == row.cap_tokens == 8_000
    assert row.reserved_bytes == 8_960_000_000 and round(row.reserved_bytes / GB, 1) == 9.0
    assert row.fits and row.agents_admitted == 8 and row.max_concurrent == 8
    assert row.waste_at_average == 0.625 and percent(row.waste_at_average) == 63
    assert round(table.live_bytes / GB, 1) == 3.4  # "9 GB reserved to hold 3.4 GB"

    # paged, 16-token blocks: on demand, fits, no cap until 10 GB (~71k tokens), under 1%.
    row = table.paged
    assert row.scheme is Scheme.PAGED
    assert row.reserve_tokens is None and row.cap_tokens is None
    assert row.fits and row.agents_admitted == 8
    assert row.waste_at_average < 0.01
    assert row.waste_at_average == pytest.approx(7.5 / 3_007.5)
    assert table.budget_tokens == 71_428  # 10e9 / 0.14e6
    assert row.capacity_tokens == 71_424  # whole 16-token blocks: 4,464 of them
    assert table.num_blocks == 4_464 and round(row.capacity_tokens / 1000) == 71
    assert row.reserved_bytes < table.kv_budget_bytes
    # Guaranteed mode still bounds paging at the 16k ceiling: admission is the lever.
    assert row.max_concurrent == 4

    assert table.rows == (table.contiguous_ceiling, table.contiguous_cap, table.paged)
    assert table.safety_factor == DEFAULT_SAFETY_FACTOR


def test_the_qwen3_5_preset_is_about_0_14_mb_per_token_and_tells_the_same_story() -> None:
    assert QWEN3_5_9B.bytes_per_token == 2 * 34 * 4 * 256 * 2
    assert round(QWEN3_5_9B.bytes_per_token / MB, 2) == 0.14
    table = compare_schemes(kv_shape=QWEN3_5_9B, **DESIGN_WORKLOAD)
    assert round(table.contiguous_ceiling.reserved_bytes / GB) == 18
    assert table.contiguous_ceiling.agents_admitted == 4
    assert round(table.contiguous_cap.reserved_bytes / GB) == 9
    assert table.contiguous_cap.fits and percent(table.contiguous_cap.waste_at_average) == 63
    assert table.paged.agents_admitted == 8 and table.paged.waste_at_average < 0.01
    assert round(table.budget_tokens / 1000) == 72


def test_the_lower_cap_defaults_to_half_the_ceiling_and_can_be_set() -> None:
    table = compare_schemes(kv_shape=DESIGN_SHAPE, **DESIGN_WORKLOAD, lower_cap_tokens=4_000)
    assert table.contiguous_cap.cap_tokens == 4_000
    assert table.contiguous_cap.waste_at_average == 0.25
    odd = compare_schemes(
        kv_shape=DESIGN_SHAPE, kv_budget_bytes=GB, num_agents=1, ceiling_tokens=1, average_tokens=1
    )
    assert odd.contiguous_cap.cap_tokens == 1


def test_results_are_frozen() -> None:
    table = compare_schemes(kv_shape=DESIGN_SHAPE, **DESIGN_WORKLOAD)
    with pytest.raises(dataclasses.FrozenInstanceError):
        table.paged.fits = False  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        DESIGN_SHAPE.layers = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"average_tokens": 20_000}, "must not exceed ceiling_tokens"),
        ({"lower_cap_tokens": 32_000}, "must not exceed ceiling_tokens"),
        ({"num_agents": 0}, "num_agents must be a whole number of at least 1"),
        ({"ceiling_tokens": -16_000}, "ceiling_tokens must be a whole number of at least 1"),
        ({"kv_budget_bytes": -1}, "kv_budget_bytes must be a whole number of at least 0"),
        ({"block_size": 0}, "block_size"),
        ({"safety_factor": 0.0}, r"safety_factor must be a number in \(0, 1\]"),
    ],
)
def test_compare_schemes_refuses_bad_input(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        compare_schemes(kv_shape=DESIGN_SHAPE, **{**DESIGN_WORKLOAD, **changes})  # type: ignore[arg-type]


def test_kv_bytes_per_token_is_two_times_layers_heads_dim_and_dtype() -> None:
    shape = KVShape(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)
    assert shape.bytes_per_token == 131_072
    assert shape.bytes_per_block(16) == 16 * 131_072
    with pytest.raises(ConfigError, match="layers must be a whole number of at least 1"):
        KVShape(layers=0, kv_heads=8, head_dim=128, dtype_bytes=2)
    with pytest.raises(ConfigError, match="dtype_bytes"):
        KVShape(layers=1, kv_heads=1, head_dim=1, dtype_bytes=True)  # type: ignore[arg-type]


def test_blocks_per_seq_rounds_up() -> None:
    assert blocks_per_seq(16_000, 16) == 1_000
    assert blocks_per_seq(16_001, 16) == 1_001
    assert blocks_per_seq(1, 16) == 1
    with pytest.raises(ConfigError, match="ceiling_tokens"):
        blocks_per_seq(0, 16)
    with pytest.raises(ConfigError, match="block_size"):
        blocks_per_seq(16, -16)


def test_max_concurrent_uses_the_safety_factor_as_written() -> None:
    assert max_concurrent(4_464, 16_000, 16, 0.9) == 4
    assert max_concurrent(4_464, 8_000, 16, 0.9) == 8
    assert max_concurrent(10, 7, 1, 0.7) == 1  # 10 x 0.7 is 7, not 6.999...
    assert max_concurrent(0, 16, 16, 1.0) == 0
    assert max_concurrent(999, 16_000, 16, 1) == 0


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.0001, 2, float("nan"), True, "0.9", None])
def test_max_concurrent_refuses_a_safety_factor_outside_zero_to_one(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"\(0, 1\]") as caught:
        max_concurrent(100, 16, 16, bad)  # type: ignore[arg-type]
    assert caught.value.setting == "safety_factor"


@given(
    available=st.integers(0, 10**7),
    ceiling=st.integers(1, 10**6),
    block_size=st.sampled_from([1, 8, 16, 32, 256]),
    safety=st.sampled_from([0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99, 1.0]),
)
def test_max_concurrent_is_the_largest_count_whose_ceilings_fit(
    available: int, ceiling: int, block_size: int, safety: float
) -> None:
    per_seq = blocks_per_seq(ceiling, block_size)
    n = max_concurrent(available, ceiling, block_size, safety)
    usable = available * Fraction(str(safety))
    assert n * per_seq <= usable < (n + 1) * per_seq


def test_max_ceiling_tokens_is_the_largest_admissible_ceiling() -> None:
    assert max_ceiling_tokens(4_464, 16) == 71_424
    assert max_ceiling_tokens(4_464, 16, 0.9) == 4_017 * 16
    ceiling = max_ceiling_tokens(100, 16, 0.9)
    assert max_concurrent(100, ceiling, 16, 0.9) == 1
    assert max_concurrent(100, ceiling + 1, 16, 0.9) == 0
    assert max_ceiling_tokens(0, 16) == 0


# Hugging Face configs


def test_a_llama_config_gives_its_kv_shape() -> None:
    shape = kv_shape_from_hf_config(LLAMA3_8B)
    assert shape == KVShape(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)
    assert shape.bytes_per_token == 131_072


def test_kv_heads_default_to_attention_heads_and_head_dim_can_be_explicit() -> None:
    mha = {k: v for k, v in LLAMA3_8B.items() if k != "num_key_value_heads"}
    assert kv_shape_from_hf_config(mha).kv_heads == 32
    qwen3_4b = {
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 2560,
        "head_dim": 128,
        "torch_dtype": "bfloat16",
    }
    assert kv_shape_from_hf_config(qwen3_4b).head_dim == 128  # not 2560 / 32
    assert kv_shape_from_hf_config({**qwen3_4b, "head_dim": None}).head_dim == 80


def test_a_multimodal_config_is_read_from_text_config_and_skips_linear_layers() -> None:
    layer_types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    qwen3_5 = {
        "model_type": "qwen3_5",
        "text_config": {
            "num_hidden_layers": 32,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "hidden_size": 4096,
            "layer_types": layer_types * 8,
        },
        "dtype": "bfloat16",
    }
    shape = kv_shape_from_hf_config(qwen3_5)
    assert shape == KVShape(layers=8, kv_heads=4, head_dim=256, dtype_bytes=2)
    text_config = qwen3_5["text_config"]
    assert isinstance(text_config, dict)
    no_types = {k: v for k, v in text_config.items() if k != "layer_types"}
    interval = {**qwen3_5, "text_config": {**no_types, "full_attention_interval": 4}}
    assert kv_shape_from_hf_config(interval).layers == 8
    sliding = {**qwen3_5, "text_config": {**text_config, "layer_types": ["sliding_attention"] * 4}}
    assert kv_shape_from_hf_config(sliding).layers == 4  # counted in full: an upper bound


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("float16", 2), ("bfloat16", 2), ("float32", 4), ("fp8", 1), ("torch.float16", 2)],
)
def test_the_dtype_comes_from_the_config_or_an_override(dtype: str, expected: int) -> None:
    assert kv_shape_from_hf_config({**LLAMA3_8B, "torch_dtype": dtype}).dtype_bytes == expected
    assert kv_shape_from_hf_config(LLAMA3_8B, dtype=dtype).dtype_bytes == expected


def test_a_config_is_read_from_a_file_or_a_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B), encoding="utf-8")
    assert kv_shape_from_hf_config(tmp_path) == kv_shape_from_hf_config(LLAMA3_8B)
    assert kv_shape_from_hf_config(str(tmp_path / "config.json")).layers == 32


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({**LLAMA3_8B, "num_hidden_layers": None}, "missing num_hidden_layers"),
        ({k: v for k, v in LLAMA3_8B.items() if k != "num_attention_heads"}, "missing num_atten"),
        ({**LLAMA3_8B, "num_key_value_heads": "8"}, "num_key_value_heads must be a whole"),
        ({**LLAMA3_8B, "hidden_size": 4095}, "add head_dim"),
        ({**LLAMA3_8B, "head_dim": 0}, "head_dim must be a whole number of at least 1"),
        ({k: v for k, v in LLAMA3_8B.items() if k != "torch_dtype"}, "pass dtype='bfloat16'"),
        ({**LLAMA3_8B, "torch_dtype": "int4"}, "'int4' is not a KV cache dtype"),
        ({**LLAMA3_8B, "torch_dtype": ["float16"]}, "is not a KV cache dtype"),
        ({**LLAMA3_8B, "kv_lora_rank": 512}, "multi-head latent attention"),
        ({**LLAMA3_8B, "text_config": "llama"}, "text_config must be a JSON object"),
        ({**LLAMA3_8B, "layer_types": "full_attention"}, "layer_types must be a list"),
        ({**LLAMA3_8B, "layer_types": ["linear_attention"] * 32}, "does not grow"),
    ],
)
def test_malformed_configs_name_the_problem(config: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        kv_shape_from_hf_config(config)


def test_an_unknown_dtype_override_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"dtype 'int8' .*float16.*bfloat16.*fp8"):
        kv_shape_from_hf_config(LLAMA3_8B, dtype="int8")


def test_unreadable_config_files_say_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read .*pass a Hugging Face model folder"):
        kv_shape_from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid JSON"):
        kv_shape_from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ConfigError, match="must hold a JSON object, found list"):
        kv_shape_from_hf_config(tmp_path)


def test_all_is_sorted() -> None:
    assert sizing.__all__ == sorted(sizing.__all__, key=lambda n: (not n.isupper(), n))
