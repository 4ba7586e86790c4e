"""What a decoder model looks like: sizes, rotary scheme and special tokens.

``ModelConfig`` is the engine's own, normalized view of a Hugging Face ``config.json``
for the Llama family: Llama 2/3, Mistral, Qwen2 and Qwen3. ``from_hf_dict`` maps the
Hugging Face names onto it and fills in what each architecture implies (Qwen2 always
has q/k/v biases, Qwen3 always normalizes q and k per head); anything the engine cannot
run faithfully (another architecture, an unknown rotary type, sliding-window attention
that would actually slide) is refused with :class:`~engine.errors.ModelConfigError`
rather than run with silently different numbers.

Both spellings of the rotary settings are read: transformers 5 writes
``rope_parameters`` (holding ``rope_theta``), older checkpoints write ``rope_scaling``
next to a top-level ``rope_theta``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import ModelConfigError

__all__ = ["SUPPORTED_ARCHITECTURES", "SUPPORTED_ROPE_TYPES", "ModelConfig", "RopeScaling"]

SUPPORTED_ARCHITECTURES: Mapping[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")

# transformers' per-architecture defaults for keys a config.json may leave out.
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 131072, "qwen2": 32768, "qwen3": 32768}
_DEFAULT_ROPE_THETA = 10000.0
_REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
_DEFAULT_RMS_NORM_EPS = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class RopeScaling:
    """A non-default rotary scheme: ``linear`` divides every frequency by ``factor``;
    ``llama3`` divides only the low frequencies and blends the middle band."""

    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3"):
            raise ModelConfigError(_unsupported_rope(self.rope_type))
        _require_number("rope factor", self.factor, positive=True)
        if self.rope_type == "llama3":
            low = _require_number("llama3 low_freq_factor", self.low_freq_factor, positive=True)
            high = _require_number("llama3 high_freq_factor", self.high_freq_factor, positive=True)
            _require_int(
                "llama3 original_max_position_embeddings", self.original_max_position_embeddings
            )
            if high <= low:
                raise ModelConfigError(
                    f"llama3 rope needs high_freq_factor > low_freq_factor, got {high} <= {low}; "
                    "fix rope_parameters"
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """One Llama-family decoder's shape; build it with ``from_pretrained``/``from_hf_dict``
    or directly (presets). ``eos_token_ids`` is empty when the config names none."""

    model_type: str
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = _DEFAULT_RMS_NORM_EPS
    rope_theta: float = _DEFAULT_ROPE_THETA
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # biases on q, k and v
    attention_out_bias: bool = False  # bias on o_proj (Llama and Qwen3 `attention_bias`)
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim of q and k, before rotary
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model_type, str) or self.model_type not in SUPPORTED_ARCHITECTURES:
            raise ModelConfigError(_unsupported_model_type(self.model_type))
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            _require_int(name, getattr(self, name))
        _require_number("rms_norm_eps", self.rms_norm_eps, positive=True)
        _require_number("rope_theta", self.rope_theta, positive=True)
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ModelConfigError(
                f"head_dim must be even for rotary embeddings, got {self.head_dim}"
            )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``config.json`` from a local Hugging Face model folder."""
        folder = Path(path)
        if not folder.is_dir():
            raise ModelConfigError(
                "not a folder; pass the path of a local Hugging Face model folder "
                "(one holding config.json and *.safetensors)",
                path=str(folder),
            )
        file = folder / "config.json"
        if not file.is_file():
            raise ModelConfigError(
                "no config.json in this folder; pass a Hugging Face model folder, e.g. one "
                "written by transformers' save_pretrained()",
                path=str(folder),
            )
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelConfigError(
                f"config.json is not valid JSON ({exc}); restore it from the original model",
                path=str(file),
            ) from exc
        if not isinstance(data, dict):
            raise ModelConfigError(
                f"config.json must hold a JSON object, found {type(data).__name__}",
                path=str(file),
            )
        try:
            return cls.from_hf_dict(data)
        except ModelConfigError as exc:
            raise ModelConfigError(exc.problem, path=str(file)) from None

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, object]) -> ModelConfig:
        """Normalize a Hugging Face config dict (the contents of ``config.json``)."""
        model_type = d.get("model_type")
        if not isinstance(model_type, str) or model_type not in SUPPORTED_ARCHITECTURES:
            raise ModelConfigError(_unsupported_model_type(model_type))
        architecture = SUPPORTED_ARCHITECTURES[model_type]
        listed = d.get("architectures")
        if isinstance(listed, list) and listed and architecture not in listed:
            raise ModelConfigError(
                f"architectures {listed} does not include {architecture}; only causal "
                f"language models are supported: {', '.join(SUPPORTED_ARCHITECTURES.values())}"
            )
        missing = [key for key in _REQUIRED_KEYS if d.get(key) is None]
        if missing:
            raise ModelConfigError(
                f"config is missing required key(s) {', '.join(missing)} for model_type "
                f"{model_type!r}; restore them from the original model's config.json"
            )
        hidden_act = d.get("hidden_act", "silu")
        if hidden_act != "silu":
            raise ModelConfigError(
                f"hidden_act {hidden_act!r} is not supported; the Llama family uses 'silu'"
            )
        # Checked here too so that errors name the keys as config.json spells them.
        ints = {
            key: _require_int(key, d[key])
            for key in (*_REQUIRED_KEYS, "num_key_value_heads", "head_dim")
            if d.get(key) is not None
        }
        hidden_size, num_heads = ints["hidden_size"], ints["num_attention_heads"]
        num_kv_heads = ints.get("num_key_value_heads")
        head_dim = ints.get("head_dim")
        if head_dim is None:
            if hidden_size % num_heads:
                raise ModelConfigError(
                    f"hidden_size ({hidden_size}) is not a multiple of num_attention_heads "
                    f"({num_heads}) and there is no head_dim; add head_dim to the config"
                )
            head_dim = hidden_size // num_heads
        max_positions = d.get("max_position_embeddings", _DEFAULT_MAX_POSITIONS[model_type])
        rope_theta, rope_scaling = _parse_rope(d, max_positions)
        has_bias = bool(d.get("attention_bias", False)) and model_type != "mistral"
        config = cls(
            model_type=model_type,
            architecture=architecture,
            vocab_size=ints["vocab_size"],
            hidden_size=hidden_size,
            intermediate_size=ints["intermediate_size"],
            num_layers=ints["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=num_heads if num_kv_heads is None else num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_require_number(
                "rms_norm_eps", d.get("rms_norm_eps", _DEFAULT_RMS_NORM_EPS), positive=True
            ),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=_require_int("max_position_embeddings", max_positions),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=model_type == "qwen2" or has_bias,
            attention_out_bias=has_bias,
            mlp_bias=model_type == "llama" and bool(d.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            bos_token_id=_optional_token("bos_token_id", d.get("bos_token_id")),
            eos_token_ids=_eos_tokens(d.get("eos_token_id")),
            torch_dtype=_dtype_name(d.get("torch_dtype", d.get("dtype"))),
        )
        _check_sliding_window(d, config)
        return config

    def to_hf_dict(self) -> dict[str, object]:
        """The ``config.json`` contents that transformers reads as this same model.

        Raises ModelConfigError when the switches cannot be spelled in the Hugging Face
        config of ``model_type`` (e.g. q/k norm on a llama), checked by a round trip.
        """
        rope: dict[str, object] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            scaling = self.rope_scaling
            rope.update(rope_type=scaling.rope_type, factor=scaling.factor)
            if scaling.rope_type == "llama3":
                rope.update(
                    low_freq_factor=scaling.low_freq_factor,
                    high_freq_factor=scaling.high_freq_factor,
                    original_max_position_embeddings=scaling.original_max_position_embeddings,
                )
        eos = list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else None
        d: dict[str, object] = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos if eos else next(iter(self.eos_token_ids), None),
        }
        if self.model_type in ("llama", "qwen3"):
            d["attention_bias"] = self.attention_out_bias
        if self.model_type == "llama":
            d["mlp_bias"] = self.mlp_bias
        if self.torch_dtype is not None:
            d["dtype"] = self.torch_dtype
        if ModelConfig.from_hf_dict(d) != self:
            raise ModelConfigError(
                f"this config's switches (attention_bias={self.attention_bias}, "
                f"attention_out_bias={self.attention_out_bias}, mlp_bias={self.mlp_bias}, "
                f"qk_norm={self.qk_norm}) do not exist together in a Hugging Face "
                f"{self.model_type!r} config; pick the model_type that has them"
            )
        return d

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """K and V of one token across every layer: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype.itemsize

    def num_projection_weights(self) -> int:
        """The weights of every layer's projections (q, k, v, o, gate, up, down; biases
        not counted): what weight-only quantization stores in fewer bits."""
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (q_size + 2 * kv_size) + q_size * self.hidden_size
        return self.num_layers * (attention + 3 * self.hidden_size * self.intermediate_size)

    def num_parameters(self) -> int:
        """Parameters of the model this config describes (a tied lm_head counts once)."""
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        per_layer = (q_size + 2 * kv_size) * self.attention_bias
        per_layer += self.hidden_size * self.attention_out_bias
        per_layer += 2 * self.head_dim * self.qk_norm
        per_layer += (2 * self.intermediate_size + self.hidden_size) * self.mlp_bias
        per_layer += 2 * self.hidden_size  # the two norms
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return (
            self.num_projection_weights()
            + embeddings
            + self.num_layers * per_layer
            + self.hidden_size  # the final norm
        )


def _parse_rope(d: Mapping[str, object], max_positions: object) -> tuple[float, RopeScaling | None]:
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ModelConfigError(f"rope_parameters must be a JSON object, got {params!r}")
    if any(isinstance(value, Mapping) for value in params.values()):
        raise ModelConfigError(
            f"per-layer-type rope_parameters ({', '.join(params)}) are not supported; the "
            "Llama family uses one rotary scheme for every layer"
        )
    theta = params.get("rope_theta") or d.get("rope_theta") or _DEFAULT_ROPE_THETA
    theta = _require_number("rope_theta", theta, positive=True)
    partial = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ModelConfigError(
            f"partial_rotary_factor {partial} is not supported; only full-width rotary "
            "embeddings (1.0) are"
        )
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelConfigError(_unsupported_rope(rope_type))
    if rope_type == "default":
        return theta, None
    if params.get("factor") is None:
        raise ModelConfigError(f"{rope_type} rope needs a 'factor' in rope_parameters")
    if rope_type == "linear":
        return theta, RopeScaling(rope_type="linear", factor=params["factor"])
    for key in ("low_freq_factor", "high_freq_factor"):
        if params.get(key) is None:
            raise ModelConfigError(f"llama3 rope needs {key!r} in rope_parameters")
    return theta, RopeScaling(
        rope_type="llama3",
        factor=params["factor"],
        low_freq_factor=params["low_freq_factor"],
        high_freq_factor=params["high_freq_factor"],
        original_max_position_embeddings=params.get(
            "original_max_position_embeddings", max_positions
        ),
    )


def _check_sliding_window(d: Mapping[str, object], config: ModelConfig) -> None:
    """Accept a sliding window only where it never slides: off, or wider than any sequence."""
    window = d.get("sliding_window")
    if window is None or config.model_type == "llama":
        return
    is_qwen = config.model_type in ("qwen2", "qwen3")
    # Qwen reads the window only with use_sliding_window (default false), and then only
    # from layer max_window_layers on; layer_types, when present, spells that out.
    if is_qwen and not d.get("use_sliding_window", False):
        return
    layer_types = d.get("layer_types")
    if isinstance(layer_types, list) and "sliding_attention" not in layer_types:
        return
    max_window_layers = d.get("max_window_layers", 28)
    if (
        is_qwen
        and layer_types is None
        and isinstance(max_window_layers, int)
        and max_window_layers >= config.num_layers
    ):
        return
    if isinstance(window, int) and window >= config.max_position_embeddings:
        return
    raise ModelConfigError(
        f"sliding-window attention (sliding_window={window}, max_position_embeddings="
        f"{config.max_position_embeddings}) is not supported; use a checkpoint without a "
        "sliding window, or set sliding_window to null if the model attends to full context"
    )


def _unsupported_model_type(model_type: object) -> str:
    return (
        f"model_type {model_type!r} is not supported; supported model types: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)} "
        f"({', '.join(SUPPORTED_ARCHITECTURES.values())})"
    )


def _unsupported_rope(rope_type: object) -> str:
    return (
        f"rope type {rope_type!r} is not supported; supported rope types: "
        f"{', '.join(SUPPORTED_ROPE_TYPES)}"
    )


def _require_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def _require_number(name: str, value: object, *, positive: bool) -> float:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or (positive and value <= 0)
    ):
        raise ModelConfigError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _optional_token(name: str, value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ModelConfigError(f"{name} must be a non-negative integer or null, got {value!r}")
    return value


def _eos_tokens(value: object) -> tuple[int, ...]:
    values = value if isinstance(value, (list, tuple)) else [value]
    return tuple(
        token for token in (_optional_token("eos_token_id", v) for v in values) if token is not None
    )


def _dtype_name(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ModelConfigError(f"torch_dtype must be a string such as 'bfloat16', got {value!r}")
    return value
