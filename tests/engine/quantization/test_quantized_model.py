"""Quantized projections in the model: what loading stores, and what forward computes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine import Engine, EngineConfig, SamplingParams
from engine.attention import ReferenceAttention
from engine.models import LlamaForCausalLM
from engine.presets import get_preset, init_random_weights
from engine.quantization import QuantizedLinear, QuantizedRows, WeightQuantization, quantize
from engine.weights import hf_tensor_views, load_model, save_model, weights_nbytes

# tiny-random's shape with a small vocabulary: every projection's input is 256 or 1024.
SMALL = replace(get_preset("tiny-random").config, vocab_size=512, tie_word_embeddings=False)
TOKENIZER = get_preset("tiny-random").tokenizer  # prompts are token ids below 512


@pytest.mark.parametrize("scheme", list(WeightQuantization))
def test_loading_in_row_slices_stores_the_codes_of_each_whole_tensor(
    scheme, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = LlamaForCausalLM(SMALL, attention=ReferenceAttention(), device="cpu")
    init_random_weights(full, seed=3)
    save_model(full, tmp_path)
    # 3 rows of 256 float32 columns per slice: slices end mid-tensor and mid-projection.
    monkeypatch.setattr("engine.weights._QUANTIZE_ROWS_BYTES", 3 * 4 * 256)
    loaded = load_model(tmp_path, attention=ReferenceAttention(), device="cpu", quantization=scheme)
    expected = hf_tensor_views(full)
    for name, target in hf_tensor_views(loaded).items():
        if not isinstance(target, QuantizedRows):
            assert torch.equal(target, expected[name]), name
            continue
        want = quantize(expected[name], scheme, group_size=128, scale_dtype=torch.float32)
        layer, rows = target.layer, slice(target.start, target.stop)
        assert torch.equal(layer.qweight[rows], want.qweight), name
        assert torch.equal(layer.scales[rows], want.scales), name


def test_a_quantized_layer_multiplies_by_its_dequantized_weight() -> None:
    layer = QuantizedLinear(256, 48, bias=True, scheme=WeightQuantization.INT4, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    layer.rows().copy_(torch.randn(48, 256, generator=generator))
    with torch.no_grad():
        layer.bias.copy_(torch.randn(48, generator=generator))
    x = torch.randn(5, 256, generator=generator)
    want = F.linear(x, layer.dequantized_weight(), layer.bias)
    torch.testing.assert_close(layer(x), want, rtol=0, atol=0)


def test_an_int4_engine_computes_what_its_dequantized_weights_would(tmp_path: Path) -> None:
    full = LlamaForCausalLM(SMALL, attention=ReferenceAttention(), device="cpu")
    init_random_weights(full, seed=5)
    save_model(full, tmp_path)
    config = EngineConfig(model=str(tmp_path), tokenizer=TOKENIZER, num_blocks=32)
    engines = {q: Engine(replace(config, quantize=q)) for q in (None, "int4")}

    def projection_bytes(engine: Engine) -> int:
        total = 0
        for module in engine.model.layers.modules():  # the head stays full precision
            if isinstance(module, (torch.nn.Linear, QuantizedLinear)):
                total += sum(t.numel() * t.itemsize for t in module.state_dict().values())
        return total

    full, int4 = projection_bytes(engines[None]), projection_bytes(engines["int4"])
    # float32 -> 4 bits: 1/8 of the bytes, plus one float32 scale per 128 weights.
    assert int4 == full // 8 + full // 128
    # The same seeded weights, quantized as drawn: giving the full-precision engine the
    # dequantized weights makes the two the same model, so greedy tokens agree exactly.
    plain, quantized = engines[None].model, engines["int4"].model
    with torch.no_grad():
        for (name, module), (_, twin) in zip(
            plain.named_modules(), quantized.named_modules(), strict=True
        ):
            if isinstance(twin, QuantizedLinear):
                assert isinstance(module, torch.nn.Linear), name
                module.weight.copy_(twin.dequantized_weight())
    sampling = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompts = [list(range(1, 20)), list(range(40, 45))]
    want = [c.token_ids for c in engines[None].generate(prompts, sampling)]
    assert [c.token_ids for c in engines["int4"].generate(prompts, sampling)] == want
    assert all(len(tokens) == 6 for tokens in want)


@pytest.mark.parametrize("scheme", list(WeightQuantization))
def test_weights_bytes_count_a_quantized_layers_codes_and_scales(scheme, tmp_path: Path) -> None:
    """What /metrics, the live page and the governor read as the weights' size: a
    quantized projection keeps its codes and scales as buffers, which a count of
    parameters alone leaves out (an int4 model would read as its embeddings only)."""
    full = LlamaForCausalLM(SMALL, attention=ReferenceAttention(), device="cpu")
    init_random_weights(full, seed=7)
    save_model(full, tmp_path)
    loaded = load_model(tmp_path, attention=ReferenceAttention(), device="cpu", quantization=scheme)
    element = torch.float32.itemsize  # the CPU runs float32; scales are kept in it too
    full_bytes = sum(p.numel() * element for p in full.parameters())  # no tied weights here
    assert weights_nbytes(full) == full_bytes
    layers = [m for m in loaded.modules() if isinstance(m, QuantizedLinear)]
    assert layers
    code_bits = 8 if scheme is WeightQuantization.INT8 else 4
    dense = sum(m.out_features * m.in_features * element for m in layers)
    quantized = sum(
        m.out_features * m.in_features * code_bits // 8
        + m.out_features * (m.in_features // m.group_size) * element
        for m in layers
    )
    assert weights_nbytes(loaded) == full_bytes - dense + quantized
