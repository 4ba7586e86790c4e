"""The engine's Llama-family decoder against transformers on the same checkpoint.

Each case writes a random-weight transformers model to a folder, loads it with
``load_model`` and runs it through a paged KVCache with ReferenceAttention over a
non-contiguous block table: one prefill, then decode steps one token at a time, then
a two-sequence step mixing a decode with a chunked prefill. Every step's logits must
equal transformers' logits for the full sequence at the same positions (float32).
"""

from __future__ import annotations

import pytest
import torch

from engine.attention import AttentionMetadata, ReferenceAttention
from engine.kv_cache import KVCache
from engine.model_config import ModelConfig
from engine.models import LlamaForCausalLM
from engine.weights import load_model
from tests.engine.hf import rope_kwargs

TOLERANCE = 1e-4
BLOCK_SIZE = 8
PROMPT_LEN = 37
NUM_DECODE = 5


def llama3_gqa_untied():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        **rope_kwargs(
            {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        ),
    )


def llama_mqa_tied_biases_linear():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
        **rope_kwargs({"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    )


def qwen2_qkv_bias_tied():
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        **rope_kwargs({"rope_type": "default", "rope_theta": 1000000.0}),
    )


def qwen3_qk_norm_head_dim():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,  # not hidden / heads = 16
        tie_word_embeddings=False,
    )


def mistral_mqa():
    from transformers import MistralConfig

    return MistralConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=256,
        sliding_window=None,
    )


CASES = [
    pytest.param(llama3_gqa_untied, None, id="llama3-rope-gqa-untied"),
    pytest.param(llama_mqa_tied_biases_linear, None, id="llama-linear-rope-mqa-tied-biases"),
    pytest.param(qwen2_qkv_bias_tied, "20KB", id="qwen2-qkv-bias-tied-sharded"),
    pytest.param(qwen3_qk_norm_head_dim, None, id="qwen3-qk-norm-head-dim-24"),
    pytest.param(mistral_mqa, None, id="mistral-mqa"),
]


def run_step(
    model: LlamaForCausalLM,
    cache: KVCache,
    chunks: list[tuple[torch.Tensor, int, list[int]]],
) -> list[torch.Tensor]:
    """One forward over several sequences: (new token ids, tokens already cached, table)."""
    metadata = AttentionMetadata.build(
        block_size=BLOCK_SIZE,
        query_lens=[len(ids) for ids, _, _ in chunks],
        seq_lens=[cached + len(ids) for ids, cached, _ in chunks],
        block_tables=[table for _, _, table in chunks],
        device=model.device,
    )
    input_ids = torch.cat([ids for ids, _, _ in chunks])
    positions = torch.cat([torch.arange(cached, cached + len(ids)) for ids, cached, _ in chunks])
    model.attention.prepare(metadata)
    logits = model.compute_logits(model(input_ids, positions, cache, metadata))
    assert logits.dtype == torch.float32
    return list(logits.split([len(ids) for ids, _, _ in chunks]))


def max_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return (ours - theirs).abs().max().item()


@pytest.mark.parametrize(("make_config", "max_shard_size"), CASES)
def test_logits_match_transformers(make_config, max_shard_size, hf_checkpoint) -> None:
    folder, hf_model = hf_checkpoint(make_config(), max_shard_size=max_shard_size)
    if max_shard_size is not None:
        assert (folder / "model.safetensors.index.json").is_file()
    model = load_model(folder, attention=ReferenceAttention(), device="cpu")
    config = model.config
    assert config.num_parameters() == sum(p.numel() for p in hf_model.parameters())
    cache = KVCache(
        num_layers=config.num_layers,
        num_blocks=16,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        block_size=BLOCK_SIZE,
        dtype=torch.float32,
        device="cpu",
    )
    generator = torch.Generator().manual_seed(7)
    tokens = torch.randint(config.vocab_size, (PROMPT_LEN + NUM_DECODE,), generator=generator)
    other = torch.randint(config.vocab_size, (19,), generator=generator)
    with torch.inference_mode():
        expected = hf_model(tokens[None]).logits[0].float()  # [42, V]
        expected_other = hf_model(other[None]).logits[0].float()  # [19, V]

        table = [5, 2, 7, 0, 3, 6]  # 6 blocks of 8 hold 42 tokens, out of order
        (prefill,) = run_step(model, cache, [(tokens[:PROMPT_LEN], 0, table)])
        errors = [max_error(prefill, expected[:PROMPT_LEN])]
        for step in range(NUM_DECODE):
            pos = PROMPT_LEN + step
            (decode,) = run_step(model, cache, [(tokens[pos : pos + 1], pos, table)])
            errors.append(max_error(decode[0], expected[pos]))

        # A fresh cache; two sequences of different lengths share each step.
        cache.kv.zero_()
        table_a, table_b = [9, 4, 11, 1, 13, 8], [12, 10, 15]
        logits_a, logits_b = run_step(
            model, cache, [(tokens[:30], 0, table_a), (other[:13], 0, table_b)]
        )
        errors += [max_error(logits_a, expected[:30]), max_error(logits_b, expected_other[:13])]
        # Sequence a decodes one token while b prefills its next chunk after its cached prefix.
        logits_a, logits_b = run_step(
            model, cache, [(tokens[30:31], 30, table_a), (other[13:19], 13, table_b)]
        )
        errors += [max_error(logits_a[0], expected[30]), max_error(logits_b, expected_other[13:])]
    assert max(errors) < TOLERANCE, errors


def test_config_read_back_matches_transformers(hf_checkpoint) -> None:
    folder, _ = hf_checkpoint(qwen3_qk_norm_head_dim())
    config = ModelConfig.from_pretrained(folder)
    assert config.architecture == "Qwen3ForCausalLM"
    assert (config.head_dim, config.num_kv_heads, config.qk_norm) == (24, 2, True)
    assert not config.attention_bias
    assert ModelConfig.from_hf_dict(config.to_hf_dict()) == config
