"""Fixtures for the model tests: tiny checkpoints written to temporary folders.

``hf_checkpoint`` builds a random-weight transformers model and saves it the way a
real download looks (config.json plus safetensors); ``engine_checkpoint`` writes one
from the engine's own model without transformers, for the loader's error tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.attention import ReferenceAttention
from engine.model_config import ModelConfig
from engine.models import LlamaForCausalLM
from engine.presets import init_random_weights
from engine.weights import hf_tensor_views
from tests.engine import hf

TINY_LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False,
}


def randomize_(model: torch.nn.Module, *, seed: int) -> None:
    """Perturb every parameter, norms and biases included, so a mis-mapped one shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * noise)
            else:
                param.copy_(0.15 * noise)


@pytest.fixture
def hf_checkpoint(tmp_path: Path) -> Callable[..., tuple[Path, torch.nn.Module]]:
    """``make(config, *, max_shard_size=None)`` -> (folder, the transformers model)."""
    AutoModelForCausalLM = hf.models().AutoModelForCausalLM

    def make(config: object, *, max_shard_size: str | None = None, seed: int = 0):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        randomize_(model, seed=seed)
        model.eval()
        folder = tmp_path / f"{config.model_type}-{seed}"
        kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
        model.save_pretrained(folder, **kwargs)
        return folder, model

    return make


@pytest.fixture
def engine_checkpoint(tmp_path: Path) -> Callable[..., Path]:
    """``make(**overrides)`` -> a folder holding a TINY_LLAMA-based checkpoint."""

    def make(name: str = "ckpt", **overrides: object) -> Path:
        config = ModelConfig.from_hf_dict({**TINY_LLAMA, **overrides})
        model = LlamaForCausalLM(config, attention=ReferenceAttention(), device="cpu")
        init_random_weights(model, seed=1)
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config.to_hf_dict()))
        tensors = {k: v.contiguous() for k, v in hf_tensor_views(model).items()}
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder

    return make
