"""A small random-weight Llama checkpoint, written with transformers, shared by the
engine tests. Untied embeddings and a 512-token vocabulary keep greedy outputs varied,
so a wrong K/V shows up as different tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine import hf

VOCAB = 512


def _checkpoint(factory: pytest.TempPathFactory, family: str) -> Path:
    transformers = hf.models()
    config_cls, model_cls, extra = {
        "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
    }[family]
    path = factory.mktemp(f"{family}-tiny")
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        **extra,
    )
    getattr(transformers, model_cls)(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory, "llama")


@pytest.fixture(scope="session", params=["llama", "qwen2", "qwen3"])
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory, request.param)


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    """8 prompts of different lengths, two of them sharing a 40-token opening."""
    g = torch.Generator().manual_seed(1)
    out = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (3, 9, 17, 33, 50, 71)]
    opening = torch.randint(0, VOCAB, (40,), generator=g).tolist()
    out += [[*opening, 1, 2, 3], [*opening, 4, 5, 6, 7, 8]]
    return out
