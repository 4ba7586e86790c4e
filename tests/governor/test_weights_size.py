"""Weights' bytes from a config.json, held to the digit for Llama 3 8B's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from governor.errors import ConfigError
from governor.weights_size import weights_bytes_from_hf_config
from kvgov.cli import app

LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
# Per layer: q 4096x4096 + k, v 2 x 4096x1024 + o 4096x4096 + gate, up, down 3 x 4096x14336.
PROJECTIONS = 32 * (16_777_216 + 8_388_608 + 16_777_216 + 176_160_768)  # 6,979,321,856
OTHERS = 2 * 128256 * 4096 + (2 * 32 + 1) * 4096  # embeddings, head, norms: 16-bit


@pytest.mark.parametrize(
    ("quantize", "expected"),
    [
        (None, 2 * (PROJECTIONS + OTHERS)),  # 16.06 GB: 8.03B parameters
        ("int8", PROJECTIONS + PROJECTIONS // 128 * 2 + 2 * OTHERS),
        ("int4", PROJECTIONS // 2 + PROJECTIONS // 128 * 2 + 2 * OTHERS),  # 5.70 GB
    ],
)
def test_llama3_8b_weights(quantize: str | None, expected: int) -> None:
    assert weights_bytes_from_hf_config(LLAMA3_8B, quantize=quantize) == expected


def test_a_bad_scheme_says_what_to_pass() -> None:
    with pytest.raises(ConfigError, match="int8, int4 or omitted"):
        weights_bytes_from_hf_config(LLAMA3_8B, quantize="int2")


def test_kvgov_plan_counts_quantized_weights(tmp_path: Path) -> None:
    config = {**LLAMA3_8B, "torch_dtype": "bfloat16", "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    runner = CliRunner()
    result = runner.invoke(app, ["plan", "--config", str(tmp_path), "--quantize", "int4"])
    assert result.exit_code == 0, result.output
    assert "- 5.70059 GB weights -" in " ".join(result.output.split())
    refused = runner.invoke(app, ["plan", "--preset", "qwen3.5-9b", "--quantize", "int4"])
    assert refused.exit_code == 2 and "pass --config PATH" in refused.output
