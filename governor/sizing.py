"""KV-cache sizing: bytes per token, admission limits, and contiguous versus paged.

Pure arithmetic over integers (torch is not needed): a model's ``KVShape`` gives its KV
bytes per token, ``blocks_per_seq`` and ``max_concurrent`` are the admission formulas
the governor enforces, and ``compare_schemes`` reproduces CONTRIBUTING.md's table of what N
agents cost under a contiguous reserve-for-max cache and under paging.

Units: 1 MB = 1e6 bytes, 1 GB = 1e9 bytes, 16k = 16,000 tokens.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from pathlib import Path
from typing import Any

from governor.errors import ConfigError

__all__ = [
    "DEFAULT_SAFETY_FACTOR",
    "QWEN3_5_9B",
    "KVShape",
    "Scheme",
    "SchemeComparison",
    "SchemeSizing",
    "blocks_per_seq",
    "compare_schemes",
    "kv_shape_from_hf_config",
    "max_ceiling_tokens",
    "max_concurrent",
]

DEFAULT_SAFETY_FACTOR = 0.9

_DTYPE_BYTES = {
    **dict.fromkeys(("float32", "fp32"), 4),
    **dict.fromkeys(("float16", "fp16", "half", "bfloat16", "bf16"), 2),
    **dict.fromkeys(("fp8", "float8_e4m3fn", "float8_e5m2"), 1),
}
# Layer kinds that keep a fixed-size state instead of K and V for every token.
_STATE_ONLY_LAYERS = frozenset({"linear_attention", "mamba", "conv"})


def _safety(value: object) -> Fraction:
    """The safety factor as the decimal the caller wrote (0.7 is 7/10, so 10 blocks x 0.7
    is exactly 7, not 6.999...), checked to lie in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError.safety_factor_out_of_range(value)
    if not 0 < value <= 1:  # also refuses NaN
        raise ConfigError.safety_factor_out_of_range(value)
    return Fraction(str(value))


def _require_int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError.below_minimum(name, value, minimum)
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class KVShape:
    """What one token costs in the KV cache: K and V for every layer that keeps them."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim", "dtype_bytes"):
            _require_int(name, getattr(self, name), minimum=1)

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes  # K and V

    def bytes_per_block(self, block_size: int) -> int:
        return self.bytes_per_token * _require_int("block_size", block_size, minimum=1)


# Qwen3.5-9B's attention geometry (4 KV heads of 256 dims) over 34 full-attention-
# equivalent layers: 2 x 34 x 4 x 256 x 2 bytes = 139,264 bytes, about 0.14 MB per token
# at FP16, the planning figure CONTRIBUTING.md uses. The checkpoint itself is hybrid (only every
# fourth layer keeps per-token KV, the rest are linear attention with a fixed state), so
# this is a conservative planning shape; kv_shape_from_hf_config gives a checkpoint's own.
QWEN3_5_9B = KVShape(layers=34, kv_heads=4, head_dim=256, dtype_bytes=2)


def kv_shape_from_hf_config(
    config: Mapping[str, Any] | str | os.PathLike[str], *, dtype: str | None = None
) -> KVShape:
    """The KV shape of a Hugging Face model from its config.json (a dict, file or folder).

    Multimodal configs are read from their ``text_config``. Layers listed in
    ``layer_types`` as linear attention, mamba or conv keep no per-token KV and are not
    counted; sliding-window layers are counted in full (an upper bound). ``dtype``
    (``"float16"``, ``"bfloat16"``, ``"float32"`` or ``"fp8"``) overrides the config's
    ``torch_dtype``/``dtype``, e.g. for an FP8 KV cache.
    """
    top = config if isinstance(config, Mapping) else _read_config(config)
    text = top.get("text_config")
    if text is not None and not isinstance(text, Mapping):
        raise ConfigError(f"text_config must be a JSON object, found {type(text).__name__}")
    d: Mapping[str, Any] = text if text is not None else top
    if d.get("kv_lora_rank") is not None:
        raise ConfigError(
            "this model uses multi-head latent attention (kv_lora_rank): it caches a "
            "compressed latent per token, not K and V per head; build a KVShape() with the "
            "same bytes per token by hand"
        )
    num_layers = _require_key(d, "num_hidden_layers")
    num_heads = _require_key(d, "num_attention_heads")
    kv_heads = _optional_key(d, "num_key_value_heads", default=num_heads)
    head_dim = d.get("head_dim")
    if head_dim is None:
        hidden = _require_key(d, "hidden_size")
        if hidden % num_heads:
            raise ConfigError(
                f"hidden_size ({hidden}) is not a multiple of num_attention_heads "
                f"({num_heads}) and there is no head_dim; add head_dim to the config"
            )
        head_dim = hidden // num_heads
    head_dim = _require_int("head_dim", head_dim, minimum=1)
    return KVShape(
        layers=_kv_layers(d, num_layers),
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype_bytes=_dtype_bytes(dtype, d, top),
    )


def blocks_per_seq(ceiling_tokens: int, block_size: int) -> int:
    """Blocks one sequence needs to reach ``ceiling_tokens``: ceil(ceiling / block_size)."""
    ceiling_tokens = _require_int("ceiling_tokens", ceiling_tokens, minimum=1)
    block_size = _require_int("block_size", block_size, minimum=1)
    return -(-ceiling_tokens // block_size)


def max_concurrent(
    available_blocks: int,
    ceiling_tokens: int,
    block_size: int,
    safety_factor: float,
    prefix_blocks: int = 0,
) -> int:
    """Sequences that can all reach ``ceiling_tokens`` at once, each starting with a shared
    prefix of ``prefix_blocks`` pinned blocks (out of ``available_blocks`` already, so
    counted once): floor(available_blocks * safety_factor / max(1, blocks_per_seq less
    the prefix))."""
    available_blocks = _require_int("available_blocks", available_blocks, minimum=0)
    prefix_blocks = _require_int("prefix_blocks", prefix_blocks, minimum=0)
    per_seq = max(1, blocks_per_seq(ceiling_tokens, block_size) - prefix_blocks)
    return math.floor(available_blocks * _safety(safety_factor) / per_seq)


def max_ceiling_tokens(available_blocks: int, block_size: int, safety_factor: float = 1.0) -> int:
    """The largest ceiling one sequence can be admitted with (0 when none can):
    whole blocks within floor(available_blocks * safety_factor)."""
    available_blocks = _require_int("available_blocks", available_blocks, minimum=0)
    block_size = _require_int("block_size", block_size, minimum=1)
    return math.floor(available_blocks * _safety(safety_factor)) * block_size


class Scheme(Enum):
    CONTIGUOUS_CEILING = "contiguous, reserve the ceiling"
    CONTIGUOUS_CAP = "contiguous, reserve a lower cap"
    PAGED = "paged, blocks on demand"


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemeSizing:
    """One row of the comparison: what N agents cost under ``scheme``.

    ``reserved_bytes`` is the memory set aside for all N agents: N reservations up
    front for the contiguous schemes, the blocks they hold at the average length for
    paging. ``waste_at_average`` is (reserved - live) / reserved per agent; for paging
    it is the empty slots of the last block, (block_size - 1) / 2 on average.
    ``max_concurrent`` is the guaranteed-mode limit (every agent can reach its cap at
    once, with the safety factor); ``agents_admitted`` is how many run at the average.
    """

    scheme: Scheme
    reserve_tokens: int | None  # reserved per agent up front; None: on demand
    cap_tokens: int | None  # longest context one agent may reach; None: only the budget
    reserved_bytes: int
    fits: bool
    agents_admitted: int
    waste_at_average: float
    max_concurrent: int
    capacity_tokens: int  # tokens the budget holds in all under this scheme


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemeComparison:
    """``compare_schemes``' answer: the inputs, the budget in tokens, and three rows."""

    kv_shape: KVShape
    kv_budget_bytes: int
    num_agents: int
    ceiling_tokens: int
    average_tokens: int
    block_size: int
    safety_factor: float
    num_blocks: int  # whole blocks in the budget
    budget_tokens: int  # kv_budget_bytes // bytes_per_token
    live_bytes: int  # KV that N agents at the average length really use
    contiguous_ceiling: SchemeSizing
    contiguous_cap: SchemeSizing
    paged: SchemeSizing

    @property
    def rows(self) -> tuple[SchemeSizing, SchemeSizing, SchemeSizing]:
        return (self.contiguous_ceiling, self.contiguous_cap, self.paged)


def compare_schemes(
    *,
    kv_shape: KVShape,
    kv_budget_bytes: int,
    num_agents: int,
    ceiling_tokens: int,
    average_tokens: int,
    lower_cap_tokens: int | None = None,
    block_size: int = 16,
    safety_factor: float = DEFAULT_SAFETY_FACTOR,
) -> SchemeComparison:
    """N agents that may each grow to ``ceiling_tokens`` but average ``average_tokens``:
    contiguous reserve at the ceiling, contiguous reserve at ``lower_cap_tokens``
    (default half the ceiling), and paged ``block_size``-token blocks."""
    budget = _require_int("kv_budget_bytes", kv_budget_bytes, minimum=0)
    num_agents = _require_int("num_agents", num_agents, minimum=1)
    ceiling = _require_int("ceiling_tokens", ceiling_tokens, minimum=1)
    average = _require_int("average_tokens", average_tokens, minimum=1)
    block_size = _require_int("block_size", block_size, minimum=1)
    _safety(safety_factor)
    if lower_cap_tokens is None:
        lower_cap_tokens = max(1, ceiling // 2)
    cap = _require_int("lower_cap_tokens", lower_cap_tokens, minimum=1)
    if average > ceiling or cap > ceiling:
        raise ConfigError(
            f"average_tokens ({average:,}) and lower_cap_tokens ({cap:,}) must not exceed "
            f"ceiling_tokens ({ceiling:,}); lower them or raise the ceiling"
        )
    per_token = kv_shape.bytes_per_token
    num_blocks = budget // kv_shape.bytes_per_block(block_size)

    def contiguous(scheme: Scheme, reserve: int) -> SchemeSizing:
        slot = reserve * per_token
        slots = budget // slot
        return SchemeSizing(
            scheme=scheme,
            reserve_tokens=reserve,
            cap_tokens=reserve,
            reserved_bytes=num_agents * slot,
            fits=num_agents * slot <= budget,
            agents_admitted=min(num_agents, slots),
            waste_at_average=(reserve - min(average, reserve)) / reserve,
            max_concurrent=max_concurrent(num_blocks, reserve, block_size, safety_factor),
            capacity_tokens=slots * reserve,
        )

    held_blocks = blocks_per_seq(average, block_size)
    # Lengths end anywhere in their last block, so it is (block_size - 1) / 2 slots short.
    empty_slots = (block_size - 1) / 2
    paged = SchemeSizing(
        scheme=Scheme.PAGED,
        reserve_tokens=None,
        cap_tokens=None,
        reserved_bytes=num_agents * held_blocks * kv_shape.bytes_per_block(block_size),
        fits=num_agents * held_blocks <= num_blocks,
        agents_admitted=min(num_agents, num_blocks // held_blocks),
        waste_at_average=empty_slots / (average + empty_slots),
        max_concurrent=max_concurrent(num_blocks, ceiling, block_size, safety_factor),
        capacity_tokens=num_blocks * block_size,
    )
    return SchemeComparison(
        kv_shape=kv_shape,
        kv_budget_bytes=budget,
        num_agents=num_agents,
        ceiling_tokens=ceiling,
        average_tokens=average,
        block_size=block_size,
        safety_factor=float(safety_factor),
        num_blocks=num_blocks,
        budget_tokens=budget // per_token,
        live_bytes=num_agents * average * per_token,
        contiguous_ceiling=contiguous(Scheme.CONTIGUOUS_CEILING, ceiling),
        contiguous_cap=contiguous(Scheme.CONTIGUOUS_CAP, cap),
        paged=paged,
    )


def _require_key(d: Mapping[str, Any], key: str) -> int:
    if d.get(key) is None:
        raise ConfigError(
            f"config is missing {key}; restore it from the model's original config.json",
            setting=key,
        )
    return _require_int(key, d[key], minimum=1)


def _optional_key(d: Mapping[str, Any], key: str, *, default: int) -> int:
    return default if d.get(key) is None else _require_int(key, d[key], minimum=1)


def _kv_layers(d: Mapping[str, Any], num_layers: int) -> int:
    layer_types = d.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise ConfigError("layer_types must be a list of strings such as 'full_attention'")
        layers = sum(kind not in _STATE_ONLY_LAYERS for kind in layer_types)
    elif d.get("full_attention_interval") is not None:  # Qwen3-Next style hybrids
        interval = _require_int("full_attention_interval", d["full_attention_interval"], minimum=1)
        layers = num_layers // interval
    else:
        layers = num_layers
    if layers == 0:
        raise ConfigError(
            "no layer of this model keeps per-token K and V (all are linear attention or "
            "state-space layers), so its KV cache does not grow with context"
        )
    return layers


def _dtype_bytes(override: str | None, *configs: Mapping[str, Any]) -> int:
    name: object  # a config's value may be anything JSON holds
    if override is not None:
        name, source = override, "dtype"
    else:
        found = [c.get(k) for c in configs for k in ("torch_dtype", "dtype") if c.get(k)]
        if not found:
            raise ConfigError(
                "config.json names no torch_dtype or dtype; pass dtype='bfloat16' (or "
                "'float16', 'float32', 'fp8') to say how the KV cache is stored",
                setting="dtype",
            )
        name, source = found[0], "the config's torch_dtype"
    key = name.removeprefix("torch.") if isinstance(name, str) else None
    if key not in _DTYPE_BYTES:
        raise ConfigError(
            f"{source} {name!r} is not a KV cache dtype this knows; pass dtype= one of "
            f"{', '.join(_DTYPE_BYTES)}",
            setting="dtype",
        )
    return _DTYPE_BYTES[key]


def _read_config(path: str | os.PathLike[str]) -> Mapping[str, Any]:
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"cannot read {file} ({exc.strerror or exc}); pass a Hugging Face model folder, "
            "its config.json, or the config as a dict"
        ) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{file} is not valid JSON ({exc}); restore it from the original model"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{file} must hold a JSON object, found {type(data).__name__}")
    return data
