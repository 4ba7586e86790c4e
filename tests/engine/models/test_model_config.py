"""ModelConfig: reading Hugging Face configs, refusing what the engine cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.errors import EngineError, ModelConfigError, ModelError
from engine.model_config import ModelConfig, RopeScaling

BASE = {
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}


def config(**overrides: object) -> ModelConfig:
    return ModelConfig.from_hf_dict({**BASE, **overrides})


def test_defaults_and_derived_head_dim() -> None:
    c = config()
    assert (c.architecture, c.head_dim, c.num_kv_heads, c.num_queries_per_kv) == (
        "LlamaForCausalLM",
        8,
        2,
        4,
    )
    assert (c.rope_theta, c.rope_scaling, c.tie_word_embeddings) == (10000.0, None, False)
    assert config(num_key_value_heads=None).num_kv_heads == 8


def test_explicit_head_dim_wins() -> None:
    assert config(head_dim=48).head_dim == 48


def test_config_is_frozen_and_keyword_only() -> None:
    c = config()
    with pytest.raises(AttributeError):
        c.vocab_size = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        ModelConfig("llama")  # type: ignore[misc]


def test_architecture_switches() -> None:
    assert config(model_type="qwen2").attention_bias
    assert not config(model_type="qwen2").attention_out_bias
    qwen3 = config(model_type="qwen3", attention_bias=True)
    assert qwen3.qk_norm and qwen3.attention_bias and qwen3.attention_out_bias
    llama = config(attention_bias=True, mlp_bias=True)
    assert llama.attention_bias and llama.attention_out_bias and llama.mlp_bias
    assert not config(model_type="mistral", attention_bias=True).attention_bias


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}},
        {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 8192}},
        {"rope_theta": 5e5, "rope_scaling": {"type": "llama3", "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 8192}},
    ],
    ids=["v5-rope-parameters", "v4-rope-scaling", "legacy-type-key"],
)  # fmt: skip
def test_rope_spellings_agree(rope: dict) -> None:
    c = config(**rope)
    assert c.rope_theta == 5e5
    assert c.rope_scaling == RopeScaling(
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )


def test_llama3_original_positions_default_to_max_positions() -> None:
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1, "high_freq_factor": 4}
    scaling = config(rope_scaling=rope).rope_scaling
    assert scaling is not None and scaling.original_max_position_embeddings == 4096


def test_linear_rope_and_null_scaling() -> None:
    c = config(rope_theta=1e6, rope_scaling={"type": "linear", "factor": 4.0})
    assert c.rope_scaling == RopeScaling(rope_type="linear", factor=4.0)
    assert config(rope_theta=1e6, rope_scaling=None).rope_scaling is None


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic", "longrope", "mrope"])
def test_unsupported_rope_type_names_supported_ones(rope_type: str) -> None:
    expected = rf"rope type '{rope_type}' is not supported; .*default, linear, llama3"
    with pytest.raises(ModelConfigError, match=expected):
        config(rope_scaling={"rope_type": rope_type, "factor": 2.0})
    with pytest.raises(ModelConfigError, match="not supported"):
        RopeScaling(rope_type=rope_type, factor=2.0)


def test_rope_missing_factor_and_partial_rotary() -> None:
    with pytest.raises(ModelConfigError, match="'low_freq_factor'"):
        config(rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0})
    with pytest.raises(ModelConfigError, match="needs a 'factor'"):
        config(rope_scaling={"rope_type": "linear"})
    with pytest.raises(ModelConfigError, match="partial_rotary_factor"):
        config(partial_rotary_factor=0.5)


def test_eos_list_bos_and_dtype() -> None:
    c = config(bos_token_id=1, eos_token_id=[2, 7], torch_dtype="bfloat16")
    assert (c.bos_token_id, c.eos_token_ids, c.torch_dtype) == (1, (2, 7), "bfloat16")
    assert config(eos_token_id=3, dtype="float16").eos_token_ids == (3,)
    assert config(eos_token_id=None).eos_token_ids == ()


@pytest.mark.parametrize(
    ("overrides", "accepted"),
    [
        ({"model_type": "mistral", "sliding_window": None}, True),
        ({"model_type": "mistral", "sliding_window": 8192}, True),  # wider than 4096 positions
        ({"model_type": "mistral", "sliding_window": 1024}, False),
        ({"model_type": "qwen2", "sliding_window": 1024, "use_sliding_window": False}, True),
        ({"model_type": "qwen2", "sliding_window": 1024}, True),  # use_sliding_window defaults off
        (
            {"model_type": "qwen2", "sliding_window": 1024, "use_sliding_window": True,
             "max_window_layers": 3},
            True,
        ),  # slides only from layer 3 on, and there are 3 layers
        (
            {"model_type": "qwen3", "sliding_window": 1024, "use_sliding_window": True,
             "max_window_layers": 1},
            False,
        ),
        (
            {"model_type": "qwen3", "sliding_window": 1024, "use_sliding_window": True,
             "layer_types": ["full_attention"] * 3},
            True,
        ),
        ({"sliding_window": 16}, True),  # llama has no sliding window at all
    ],
)  # fmt: skip
def test_sliding_window(overrides: dict, accepted: bool) -> None:
    if accepted:
        config(**overrides)
    else:
        with pytest.raises(ModelConfigError, match=r"sliding-window attention .* not supported"):
            config(**overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model_type": "gpt2"}, r"model_type 'gpt2' is not supported; .*llama, mistral, qwen2"),
        ({"model_type": None}, "model_type None is not supported"),
        ({"architectures": ["LlamaForSequenceClassification"]}, "only causal language models"),
        ({"hidden_size": None}, "missing required key.*hidden_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
        ({"vocab_size": "1000"}, "vocab_size must be a positive integer"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        ({"num_attention_heads": 7}, "not a multiple of num_attention_heads"),
        ({"head_dim": 9}, "head_dim must be even"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"rms_norm_eps": -1.0}, "rms_norm_eps must be a positive"),
        ({"eos_token_id": -1}, "eos_token_id must be a non-negative"),
        ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, "per-layer-type"),
    ],
)
def test_bad_configs_raise_typed_errors(overrides: dict, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message) as info:
        config(**overrides)
    assert isinstance(info.value, ModelError) and isinstance(info.value, EngineError)


def test_from_pretrained_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="not a folder"):
        ModelConfig.from_pretrained(tmp_path / "nope")
    with pytest.raises(ModelConfigError, match=r"no config\.json in this folder") as info:
        ModelConfig.from_pretrained(tmp_path)
    assert info.value.path == str(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(ModelConfigError, match=r"config\.json is not valid JSON"):
        ModelConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match="must hold a JSON object"):
        ModelConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "model_type": "bert"}))
    with pytest.raises(ModelConfigError, match="'bert' is not supported") as info:
        ModelConfig.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    assert ModelConfig.from_pretrained(tmp_path) == config()


def test_kv_bytes_and_parameter_count() -> None:
    c = config(tie_word_embeddings=True)
    assert c.kv_bytes_per_token(torch.float16) == 2 * 3 * 2 * 8 * 2
    assert c.kv_bytes_per_token(torch.float32) == 2 * c.kv_bytes_per_token(torch.bfloat16)
    per_layer = 64 * (64 + 2 * 16) + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert c.num_parameters() == 1000 * 64 + 3 * per_layer + 64
    assert config().num_parameters() == c.num_parameters() + 1000 * 64


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"model_type": "qwen2", "tie_word_embeddings": True, "eos_token_id": [5, 6]},
        {"model_type": "qwen3", "head_dim": 32, "attention_bias": True, "bos_token_id": 0},
        {"attention_bias": True, "mlp_bias": True, "rope_scaling": {"type": "linear", "factor": 2}},
        {"model_type": "mistral", "dtype": "bfloat16"},
    ],
)
def test_to_hf_dict_round_trips(overrides: dict) -> None:
    c = config(**overrides)
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c


def test_to_hf_dict_refuses_switches_the_architecture_lacks() -> None:
    fields = {f: getattr(config(), f) for f in ModelConfig.__dataclass_fields__}
    odd = ModelConfig(**{**fields, "qk_norm": True})
    with pytest.raises(ModelConfigError, match="do not exist together"):
        odd.to_hf_dict()
