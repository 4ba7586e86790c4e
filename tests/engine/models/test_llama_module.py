"""LlamaForCausalLM as a module: its parameters, its dtypes, its backend."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.attention import AttentionMetadata, ReferenceAttention
from engine.errors import InvalidRequestError
from engine.kv_cache import KVCache
from engine.model_config import ModelConfig
from engine.models import LlamaForCausalLM
from engine.presets import init_random_weights

BASE = {
    "model_type": "llama",
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


class ModuleBackend(ReferenceAttention, nn.Module):
    """A backend that is an nn.Module with a tensor of its own."""

    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.register_buffer("table", torch.arange(4.0))


def build(dtype: torch.dtype = torch.float32, **overrides: object) -> LlamaForCausalLM:
    config = ModelConfig.from_hf_dict({**BASE, **overrides})
    model = LlamaForCausalLM(config, attention=ReferenceAttention(), device="cpu", dtype=dtype)
    init_random_weights(model, seed=0, std=0.1)
    return model


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_word_embeddings": True, "num_key_value_heads": 1},
        {"model_type": "qwen2"},
        {"model_type": "qwen3", "head_dim": 40, "attention_bias": True},
        {"attention_bias": True, "mlp_bias": True},
    ],
)
def test_parameter_count_matches_config(overrides: dict) -> None:
    model = build(**overrides)
    assert sum(p.numel() for p in model.parameters()) == model.config.num_parameters()


def test_module_backend_stays_out_of_the_module_tree() -> None:
    config = ModelConfig.from_hf_dict(BASE)
    backend = ModuleBackend()
    model = LlamaForCausalLM(config, attention=backend, device="cpu")
    assert model.attention is backend
    assert torch.equal(backend.table, torch.arange(4.0))  # not wiped by to_empty()
    assert not any("table" in name for name, _ in model.named_buffers())
    assert sum(p.numel() for p in model.parameters()) == config.num_parameters()


def test_rejects_non_float_dtype() -> None:
    config = ModelConfig.from_hf_dict(BASE)
    with pytest.raises(InvalidRequestError, match=r"floating-point torch\.dtype"):
        LlamaForCausalLM(config, attention=ReferenceAttention(), device="cpu", dtype=torch.int8)


def prefill_logits(model: LlamaForCausalLM, tokens: torch.Tensor) -> torch.Tensor:
    config = model.config
    cache = KVCache(
        num_layers=config.num_layers,
        num_blocks=4,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        block_size=16,
        dtype=model.dtype,
        device="cpu",
    )
    metadata = AttentionMetadata.build(
        block_size=16,
        query_lens=[len(tokens)],
        seq_lens=[len(tokens)],
        block_tables=[[2, 0]],
        device=model.device,
    )
    with torch.inference_mode():
        model.attention.prepare(metadata)
        hidden = model(tokens, torch.arange(len(tokens)), cache, metadata)
        assert hidden.dtype == model.dtype and hidden.shape == (len(tokens), 64)
        return model.compute_logits(hidden)


def test_bfloat16_runs_close_to_float32_and_returns_float32_logits() -> None:
    tokens = torch.randint(300, (20,), generator=torch.Generator().manual_seed(0))
    full = prefill_logits(build(torch.float32, model_type="qwen3"), tokens)
    half = prefill_logits(build(torch.bfloat16, model_type="qwen3"), tokens)
    assert half.dtype == torch.float32 and half.shape == (20, 300)
    assert (half - full).abs().max().item() < 0.05 * full.abs().max().item()
