"""The capacity calculator's ``Plan`` from command-line options, shared by ``kvgov plan``
and ``kvgov map``: bad input ends the command with one line (``fail``), never a traceback.
The bundled engine's presets are offered as models only where the engine is installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvgov.cli.output import fail

if TYPE_CHECKING:
    from governor.plan import Plan

__all__ = ["plan_from_options"]


def plan_from_options(
    *,
    preset: str | None,
    config: str | None,
    card_gb: float,
    weights_gb: float,
    overhead_gb: float,
    kv_dtype: str | None,
    block_size: int,
    ceiling: int,
    cap: int | None,
    agents: int,
    average: int,
    safety: float,
) -> Plan:
    from governor.errors import GovernorError
    from governor.plan import kv_shape_for, make_plan

    try:
        model, shape = kv_shape_for(
            preset=preset, config=config, kv_dtype=kv_dtype, extra_presets=_engine_presets()
        )
        return make_plan(
            model=model,
            kv_shape=shape,
            card_gb=card_gb,
            weights_gb=weights_gb,
            overhead_gb=overhead_gb,
            num_agents=agents,
            ceiling_tokens=ceiling,
            lower_cap_tokens=cap,
            average_tokens=average,
            block_size=block_size,
            safety_factor=safety,
        )
    except GovernorError as exc:
        fail(str(exc))


def _engine_presets() -> dict[str, Any]:
    """The bundled engine's presets as KV shapes (fp16 KV, as on a GPU); none where the
    engine is not installed (they are its small test models; the real ones are sizing's)."""
    from kvgov.cli.extras import missing_for

    if missing_for("engine") is not None:
        return {}
    from engine.presets import PRESETS
    from governor.sizing import KVShape

    return {
        name: KVShape(
            layers=p.config.num_layers,
            kv_heads=p.config.num_kv_heads,
            head_dim=p.config.head_dim,
            dtype_bytes=2,
        )
        for name, p in PRESETS.items()
    }
