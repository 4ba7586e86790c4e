"""Rotary embeddings against transformers' own frequency functions, at real model sizes."""

from __future__ import annotations

import pytest
import torch

from engine.errors import ModelConfigError
from engine.model_config import ModelConfig, RopeScaling
from engine.models.rope import RotaryEmbedding, apply_rotary, rope_inv_freq
from tests.engine import hf

LLAMA31 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        LLAMA31,
    ],
    ids=["default", "linear", "llama3.1"],
)
def test_inv_freq_matches_transformers(rope: dict) -> None:
    hf.models()
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf_config = LlamaConfig(
        hidden_size=4096,
        num_attention_heads=32,
        max_position_embeddings=131072,
        **hf.rope_kwargs(rope),
    )
    expected = LlamaRotaryEmbedding(hf_config).inv_freq
    config = ModelConfig.from_hf_dict(hf_config.to_dict())
    ours = rope_inv_freq(head_dim=128, theta=config.rope_theta, scaling=config.rope_scaling)
    assert ours.dtype == torch.float32 and ours.shape == (64,)
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)


def test_rotation_matches_transformers_and_keeps_norms() -> None:
    hf.models()
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rotary = RotaryEmbedding(head_dim=64, theta=10000.0, scaling=None)
    positions = torch.tensor([0, 5, 4095, 70000])
    cos, sin = rotary(positions, torch.float32)  # [T, D]
    q, k = torch.randn(4, 8, 64), torch.randn(4, 2, 64)
    # transformers takes [B, H, T, D] and [B, T, D].
    hf_q, hf_k = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None]
    )
    torch.testing.assert_close(apply_rotary(q, cos, sin), hf_q[0].transpose(0, 1))
    torch.testing.assert_close(apply_rotary(k, cos, sin), hf_k[0].transpose(0, 1))
    torch.testing.assert_close(apply_rotary(q, cos, sin).norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(apply_rotary(q[:1], cos[:1], sin[:1]), q[:1])  # position 0


def test_unsupported_rope_type_is_refused_with_the_supported_list() -> None:
    with pytest.raises(ModelConfigError, match=r"'yarn' is not supported; .*linear, llama3"):
        RopeScaling(rope_type="yarn", factor=4.0)
    with pytest.raises(ModelConfigError, match="high_freq_factor > low_freq_factor"):
        RopeScaling(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=4.0,
            high_freq_factor=1.0,
            original_max_position_embeddings=8192,
        )
