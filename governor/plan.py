"""``kvgov plan``: the sizing calculator, before anything is loaded.

From a model's KV shape (a named preset or a Hugging Face config.json), the card's
memory, the weights' memory and a runtime overhead, the KV budget follows; from the
agents' ceiling, a lower contiguous cap, their number and their average context, the
three rows of CONTRIBUTING.md's table follow (``governor.sizing.compare_schemes``): reserve
the ceiling contiguously, reserve a lower cap contiguously, or page in blocks.

``Plan`` is plain data: the CLI prints it as a table or as JSON lines, and ``kvgov map``
draws it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import JustifyMethod
from rich.table import Table

from governor.errors import ConfigError
from governor.sizing import (
    DEFAULT_SAFETY_FACTOR,
    QWEN3_5_9B,
    KVShape,
    Scheme,
    SchemeComparison,
    compare_schemes,
    kv_shape_from_hf_config,
)

__all__ = [
    "DEFAULT_OVERHEAD_GB",
    "PRESETS",
    "Plan",
    "kv_shape_for",
    "make_plan",
    "plan_rows",
    "render_plan",
]

GB = 1e9
DEFAULT_OVERHEAD_GB = 0.5  # activations, the runtime and fragmentation, beside the weights
PRESETS: Mapping[str, KVShape] = {
    "qwen3.5-9b": QWEN3_5_9B,  # FP16 KV, about 0.14 MB per token
}
_DTYPE_BYTES = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2}
_DTYPE_BYTES |= {"fp8": 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    model: str  # the preset's name or the config's path
    card_bytes: int
    weights_bytes: int
    overhead_bytes: int
    comparison: SchemeComparison

    @property
    def kv_budget_bytes(self) -> int:
        return self.comparison.kv_budget_bytes


def kv_shape_for(
    *,
    preset: str | None,
    config: str | Path | None,
    kv_dtype: str | None,
    extra_presets: Mapping[str, KVShape] | None = None,
) -> tuple[str, KVShape]:
    """The model's name and KV shape from exactly one of ``preset`` and ``config``."""
    if (preset is None) == (config is None):
        raise ConfigError("name a model: exactly one of --preset NAME and --config PATH")
    if config is not None:
        return str(config), kv_shape_from_hf_config(config, dtype=_dtype_name(kv_dtype))
    presets = {**PRESETS, **(extra_presets or {})}
    shape = presets.get(str(preset).lower())
    if shape is None:
        raise ConfigError(
            f"unknown preset {preset!r}; the presets are {', '.join(sorted(presets))}, or "
            "pass --config with a model's config.json",
            setting="preset",
        )
    if kv_dtype is not None:
        shape = KVShape(
            layers=shape.layers,
            kv_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            dtype_bytes=_dtype_bytes(kv_dtype),
        )
    return str(preset), shape


def make_plan(
    *,
    model: str,
    kv_shape: KVShape,
    card_gb: float,
    weights_gb: float,
    overhead_gb: float = DEFAULT_OVERHEAD_GB,
    num_agents: int = 8,
    ceiling_tokens: int = 16_000,
    lower_cap_tokens: int | None = None,
    average_tokens: int = 3_000,
    block_size: int = 16,
    safety_factor: float = DEFAULT_SAFETY_FACTOR,
) -> Plan:
    for name, value in (("card_gb", card_gb), ("weights_gb", weights_gb)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigError(f"{name} must be a number of GB >= 0, got {value!r}", setting=name)
    if not isinstance(overhead_gb, (int, float)) or not overhead_gb >= 0:
        raise ConfigError(f"overhead_gb must be >= 0, got {overhead_gb!r}", setting="overhead")
    kv_gb = card_gb - weights_gb - overhead_gb
    if kv_gb <= 0:
        raise ConfigError(
            f"nothing is left for the KV cache: {card_gb:g} GB card - {weights_gb:g} GB weights "
            f"- {overhead_gb:g} GB overhead = {kv_gb:g} GB; use a bigger card, a smaller "
            "(quantized) model, or a lower --overhead-gb",
            setting="card_gb",
        )
    comparison = compare_schemes(
        kv_shape=kv_shape,
        kv_budget_bytes=int(kv_gb * GB),
        num_agents=num_agents,
        ceiling_tokens=ceiling_tokens,
        average_tokens=average_tokens,
        lower_cap_tokens=lower_cap_tokens,
        block_size=block_size,
        safety_factor=safety_factor,
    )
    return Plan(
        model=model,
        card_bytes=int(card_gb * GB),
        weights_bytes=int(weights_gb * GB),
        overhead_bytes=int(overhead_gb * GB),
        comparison=comparison,
    )


def _dtype_name(kv_dtype: str | None) -> str | None:
    if kv_dtype is None:
        return None
    _dtype_bytes(kv_dtype)
    return {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}.get(
        kv_dtype.lower(), kv_dtype.lower()
    )


def _dtype_bytes(kv_dtype: str) -> int:
    size = _DTYPE_BYTES.get(kv_dtype.lower())
    if size is None:
        raise ConfigError(
            f"unknown KV dtype {kv_dtype!r}; use one of fp32, fp16, bf16, fp8",
            setting="kv_dtype",
        )
    return size


def plan_rows(plan: Plan) -> list[dict[str, object]]:
    """The three rows as plain values (``kvgov plan --json`` prints one per line)."""
    c = plan.comparison
    rows: list[dict[str, object]] = []
    for row in c.rows:
        rows.append(
            {
                "scheme": row.scheme.value,
                "reserve_tokens": row.reserve_tokens,
                "cap_tokens": row.cap_tokens,
                "reserved_gb": row.reserved_bytes / GB,
                "fits": row.fits,
                "agents_admitted": row.agents_admitted,
                "num_agents": c.num_agents,
                "waste_at_average_pct": 100 * row.waste_at_average,
                "max_concurrent": row.max_concurrent,
                "capacity_tokens": row.capacity_tokens,
            }
        )
    return rows


_SHORT = {
    Scheme.CONTIGUOUS_CEILING: "contiguous, ceiling",
    Scheme.CONTIGUOUS_CAP: "contiguous, cap",
    Scheme.PAGED: "paged",
}


def render_plan(plan: Plan) -> tuple[str, Table]:
    """A headline and the table, for a terminal."""
    c = plan.comparison
    per_token_mb = c.kv_shape.bytes_per_token / 1e6
    headline = (
        f"{plan.model}: {per_token_mb:.3g} MB of KV per token; "
        f"{plan.card_bytes / GB:g} GB card - {plan.weights_bytes / GB:g} GB weights - "
        f"{plan.overhead_bytes / GB:g} GB overhead = {plan.kv_budget_bytes / GB:.3g} GB for KV "
        f"({c.budget_tokens:,} tokens); {c.num_agents} agents, ceiling {c.ceiling_tokens:,}, "
        f"average {c.average_tokens:,}, {c.block_size}-token blocks, safety {c.safety_factor:g}"
    )
    table = Table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        caption=(
            "reserve: tokens set aside per agent up front; memory: reserved for all agents "
            "(paged: the blocks they hold at the average); cap: the longest context one "
            "agent may reach; waste: of each reservation, at the average; max_conc: "
            "agents guaranteed their cap at once (safety factor applied); tokens: what "
            "the budget holds in all"
        ),
        caption_justify="left",
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("scheme", "left"),
        ("reserve", "right"),
        ("memory", "right"),
        ("fits", "center"),
        ("admitted", "right"),
        ("cap", "right"),
        ("waste", "right"),
        ("max_conc", "right"),
        ("tokens", "right"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for row in c.rows:
        table.add_row(
            _SHORT[row.scheme],
            "on demand" if row.reserve_tokens is None else f"{row.reserve_tokens:,}",
            f"{row.reserved_bytes / GB:.1f} GB",
            "[green]yes[/]" if row.fits else "[red]no[/]",
            f"{row.agents_admitted} of {c.num_agents}",
            "budget" if row.cap_tokens is None else f"{row.cap_tokens:,}",
            f"{100 * row.waste_at_average:.1f}%",
            str(row.max_concurrent),
            f"{row.capacity_tokens:,}",
        )
    return headline, table
