"""The models a twin can stand in for: their shapes, read from their published configs.

A twin runs the engine's own small model for its decisions and charges time and memory at
a *target* model's size. ``target_model(name_or_path, quantize=...)`` gives that target:
a named model below (its Hugging Face ``config.json`` values, copied with the address
they were read from), one of the engine's presets, or a local ``config.json`` (or the
folder holding it). ``quantize`` (``int8``/``int4``) stores the projection weights in
fewer bits; embeddings and norms stay 16-bit, as weight-only quantization keeps them.

Errors (caller input)::

    InvalidRequestError (engine.errors)
    └── TargetError   an unknown name, an unreadable config, or an unknown quantization
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from engine.errors import EngineError, InvalidRequestError
from engine.model_config import ModelConfig
from engine.presets import PRESETS
from engine.twin.shapes import ModelShape

__all__ = ["NAMED_TARGETS", "QUANTIZATIONS", "TargetError", "TargetModel", "target_model"]

QUANTIZATIONS: Mapping[str | None, int] = MappingProxyType({None: 16, "int8": 8, "int4": 4})
_ACTIVATION_BITS = 16  # bf16 or fp16 activations and KV on a GPU


class TargetError(InvalidRequestError):
    """A target model that cannot be read."""


@dataclass(frozen=True, slots=True)
class _Named:
    config: Mapping[str, Any]
    source: str  # where the config's values were read


NAMED_TARGETS: Mapping[str, _Named] = MappingProxyType(
    {
        # Qwen3-8B: 36 layers of 32 query and 8 KV heads of 128, MLP 12,288, untied
        # embeddings of 151,936 x 4,096. Its base config gives 32,768 positions natively.
        "qwen3-8b": _Named(
            config={
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "hidden_size": 4096,
                "intermediate_size": 12288,
                "num_hidden_layers": 36,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "vocab_size": 151936,
                "max_position_embeddings": 32768,
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000,
                "tie_word_embeddings": False,
                "torch_dtype": "bfloat16",
            },
            source="https://huggingface.co/Qwen/Qwen3-8B-Base/blob/main/config.json",
        ),
    }
)


@dataclass(frozen=True, slots=True)
class TargetModel:
    """A model the twin charges time and memory for."""

    label: str  # "qwen3-8b (int4)"
    shape: ModelShape
    context_tokens: int  # the longest context the model takes
    source: str  # where its shape came from

    @property
    def weights_bytes(self) -> int:
        """Device memory its weights take: projections at their bits, the rest 16-bit."""
        shape = self.shape
        projections = shape.num_projection_weights * shape.weight_bits // 8
        return projections + (shape.num_parameters - shape.num_projection_weights) * 2


def target_model(name_or_path: str, *, quantize: str | None = None) -> TargetModel:
    """The target ``name_or_path`` names (see the module docstring)."""
    if quantize not in QUANTIZATIONS:
        raise TargetError(f"--quantize {quantize!r}: use int8 or int4, or leave it out for bf16")
    config, source = _config(name_or_path)
    bits = QUANTIZATIONS[quantize]
    label = name_or_path if quantize is None else f"{name_or_path} ({quantize})"
    shape = ModelShape.from_config(
        config, name=label, activation_bits=_ACTIVATION_BITS, weight_bits=bits
    )
    return TargetModel(label, shape, config.max_position_embeddings, source)


def _config(name_or_path: str) -> tuple[ModelConfig, str]:
    named = NAMED_TARGETS.get(name_or_path.lower())
    if named is not None:
        return ModelConfig.from_hf_dict(named.config), named.source
    if name_or_path in PRESETS:
        return PRESETS[name_or_path].config, f"the engine's {name_or_path} preset"
    path = Path(name_or_path)
    if path.is_file() or (path.is_dir() and (path / "config.json").is_file()):
        folder = path if path.is_dir() else path.parent
        try:
            return ModelConfig.from_pretrained(folder), str(folder / "config.json")
        except (EngineError, OSError, ValueError) as exc:
            raise TargetError(f"cannot read a model config from {name_or_path}: {exc}") from exc
    known = ", ".join([*NAMED_TARGETS, *PRESETS])
    raise TargetError(
        f"unknown model {name_or_path!r}: name one of {known}, or give a config.json "
        "(or the folder holding it)"
    )
