"""``kvgov bench quantization``: the error weight-only int8/int4 introduces, measured.

Each figure is a relative error, ``||y_q - y|| / ||y||`` over every element, between a
model and its quantized twin: the same seeded weights, one copy in the model dtype and
one quantized as drawn (group 128, round-to-nearest, symmetric). Nothing here is a
quality claim: random weights say how far the arithmetic moves, not what a trained
model's answers would do.

- ``tiny_logits_rel_error_{int8,int4}``: float32 logits of the ``tiny-random`` preset
  over one prefill of 64 tokens (16 quick);
- ``tiny_layer{i}_rel_error_{...}``: the residual stream after each decoder layer of the
  same pass (error accumulates down the stack);
- ``8b_layer_rel_error_{...}``: one decoder layer of an 8B shape (hidden 4096,
  intermediate 14336, 32 query / 8 KV heads of 128), weights N(0, 0.02^2), input hidden
  states N(0, 1), 16 tokens (8 quick).

float32 on the CPU, where the reference path runs (dequantize, then matmul); the Triton
kernel on a GPU agrees with it to float rounding (``tests/engine/quantization``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TypeVar

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.reference import ReferenceAttention
from engine.benchmarks.measurement import Direction, Measurement
from engine.kv_cache import KVCache
from engine.model_config import ModelConfig
from engine.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from engine.models.rope import RotaryEmbedding
from engine.presets import build_preset_model, get_preset
from engine.quantization.linear import QuantizedLinear, QuantizedRows
from engine.quantization.scheme import WeightQuantization

__all__ = ["LLAMA_8B_LAYER", "layer_errors", "run", "tiny_errors"]

_BENCH = "quantization"
# One decoder layer of the llama-8b-random preset (Llama 3 8B's layer shape).
LLAMA_8B_LAYER = replace(get_preset("llama-8b-random").config, num_layers=1)
# A quantization scheme, or None for an unquantized twin: what a result is keyed by.
_Scheme = TypeVar("_Scheme", bound=WeightQuantization | None)


def run(*, quick: bool = False, seed: int = 0) -> Iterator[Measurement]:
    tiny_tokens, layer_tokens = (16, 8) if quick else (64, 16)
    schemes = tuple(WeightQuantization)
    note = f"tiny-random, float32, one {tiny_tokens}-token prefill, group 128"
    for scheme, (logits, layers) in tiny_errors(schemes, num_tokens=tiny_tokens, seed=seed).items():
        yield _figure(f"tiny_logits_rel_error_{scheme.value}", logits, note)
        for i, error in enumerate(layers):
            yield _figure(f"tiny_layer{i}_rel_error_{scheme.value}", error, note)
    note = (
        "one random decoder layer, hidden 4096, intermediate 14336, GQA 32/8 heads of "
        f"128, {layer_tokens} tokens, float32, group 128"
    )
    for scheme, error in layer_errors(schemes, num_tokens=layer_tokens, seed=seed).items():
        yield _figure(f"8b_layer_rel_error_{scheme.value}", error, note)


def _figure(metric: str, value: float, note: str) -> Measurement:
    return Measurement(
        bench=_BENCH,
        metric=metric,
        value=value,
        unit="ratio",
        direction=Direction.LOWER_IS_BETTER,
        note=note + " (random weights: no quality claim)",
    )


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return float((approx.double() - exact.double()).norm() / exact.double().norm())


def tiny_errors(
    schemes: tuple[_Scheme, ...], *, num_tokens: int, seed: int = 0
) -> dict[_Scheme, tuple[float, list[float]]]:
    """Per scheme, (logits error, each layer's output error) of ``tiny-random`` against
    its twin quantized from the very same weights (``None``: an unquantized copy)."""
    reference = build_preset_model(
        "tiny-random", attention=ReferenceAttention(), device="cpu", dtype=torch.float32, seed=seed
    )
    logits, layers = _forward_with_layers(reference, num_tokens, seed)
    errors = {}
    for scheme in schemes:
        twin = LlamaForCausalLM(
            reference.config,
            attention=ReferenceAttention(),
            device="cpu",
            dtype=torch.float32,
            quantization=scheme,
        )
        _copy_weights(reference, twin)
        q_logits, q_layers = _forward_with_layers(twin, num_tokens, seed)
        errors[scheme] = (
            relative_error(q_logits, logits),
            [relative_error(q, exact) for q, exact in zip(q_layers, layers, strict=True)],
        )
    return errors


def _copy_weights(source: LlamaForCausalLM, target: LlamaForCausalLM) -> None:
    """Every tensor of ``source`` into ``target``, quantized where ``target`` is."""
    from engine.weights import hf_tensor_views  # weights imports models, as this does

    values = hf_tensor_views(source)
    with torch.no_grad():
        for name, view in hf_tensor_views(target).items():
            value = values[name]
            assert isinstance(value, torch.Tensor)  # ``source`` is not quantized
            view.copy_(value)


@torch.inference_mode()
def _forward_with_layers(
    model: LlamaForCausalLM, num_tokens: int, seed: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    config = model.config
    tokens = torch.randint(
        0, config.vocab_size, (num_tokens,), generator=torch.Generator().manual_seed(seed)
    )
    cache, metadata = _one_prefill(config, num_tokens)
    layers: list[torch.Tensor] = []
    hooks = [
        layer.register_forward_hook(lambda _m, _i, out: layers.append(out.clone()))
        for layer in model.layers
    ]
    try:
        model.attention.prepare(metadata)
        hidden = model(tokens, torch.arange(num_tokens), cache, metadata)
    finally:
        for hook in hooks:
            hook.remove()
    return model.compute_logits(hidden), layers


def _one_prefill(config: ModelConfig, num_tokens: int) -> tuple[KVCache, AttentionMetadata]:
    block_size = 16
    num_blocks = -(-num_tokens // block_size)
    cache = KVCache(
        num_layers=config.num_layers,
        num_blocks=num_blocks,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        block_size=block_size,
        dtype=torch.float32,
        device="cpu",
    )
    metadata = AttentionMetadata.build(
        block_size=block_size,
        query_lens=[num_tokens],
        seq_lens=[num_tokens],
        block_tables=[list(range(num_blocks))],
        device=torch.device("cpu"),
    )
    return cache, metadata


@torch.inference_mode()
def layer_errors(
    schemes: tuple[_Scheme, ...],
    *,
    num_tokens: int,
    seed: int = 0,
    config: ModelConfig = LLAMA_8B_LAYER,
) -> dict[_Scheme, float]:
    """Per scheme, one random decoder layer of ``config``'s shape against its twin
    quantized from the same weights (``None``: an unquantized copy)."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_tokens, config.hidden_size, generator=generator)
    rope = RotaryEmbedding(head_dim=config.head_dim, theta=config.rope_theta, scaling=None)
    cos_sin = rope(torch.arange(num_tokens), torch.float32)
    attention = ReferenceAttention()

    def output(layer: LlamaDecoderLayer) -> torch.Tensor:
        cache, metadata = _one_prefill(config, num_tokens)
        attention.prepare(metadata)
        return layer(hidden, cos_sin, cache, metadata, attention)

    reference = _random_layer(config, seed=seed + 1)
    exact = output(reference)
    errors = {}
    for scheme in schemes:
        with torch.device("meta"):
            twin = LlamaDecoderLayer(config, layer=0, dtype=torch.float32, quantization=scheme)
        twin.to_empty(device="cpu")
        for (name, value), (slot_name, slot) in zip(
            reference.named_parameters(), _slots(twin), strict=True
        ):
            assert name == slot_name, (name, slot_name)
            if isinstance(slot, QuantizedRows):
                for begin in range(0, value.shape[0], _DRAW_ROWS):
                    slot.copy_rows(begin, value[begin : begin + _DRAW_ROWS])
            else:
                slot.copy_(value)
        errors[scheme] = relative_error(output(twin), exact)
    return errors


def _slots(layer: LlamaDecoderLayer) -> list[tuple[str, torch.Tensor | QuantizedRows]]:
    """Where each of an unquantized layer's parameters goes in ``layer``, in the order of
    ``named_parameters`` (a quantized weight is registered as buffers, after them)."""
    slots: list[tuple[str, torch.Tensor | QuantizedRows]] = []
    for name, module in layer.named_modules():
        if isinstance(module, QuantizedLinear):
            slots.append((f"{name}.weight", module.rows()))
            if module.bias is not None:
                slots.append((f"{name}.bias", module.bias))
        elif not list(module.children()):
            slots.extend((f"{name}.{p}", t) for p, t in module.named_parameters(recurse=False))
    return slots


def _random_layer(config: ModelConfig, *, seed: int) -> LlamaDecoderLayer:
    """Norms 1, projections N(0, 0.02^2), drawn in row chunks from one seeded generator."""
    with torch.device("meta"):
        layer = LlamaDecoderLayer(config, layer=0, dtype=torch.float32)
    layer.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(seed)
    for name, param in layer.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
            continue
        for begin in range(0, param.shape[0], _DRAW_ROWS):
            rows = param[begin : begin + _DRAW_ROWS]
            rows.copy_(torch.randn(rows.shape, generator=generator).mul_(0.02))
    return layer


_DRAW_ROWS = 1024
