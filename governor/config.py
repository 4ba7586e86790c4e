"""How the governor admits, queues and sizes leases."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from governor.errors import ConfigError
from governor.sizing import DEFAULT_SAFETY_FACTOR
from governor.topology import DEFAULT_EXPECTED_USE

__all__ = ["AdmissionMode", "GovernorConfig"]


class AdmissionMode(Enum):
    GUARANTEED = "guaranteed"  # every active lease fits at its ceiling: never preempted
    OVERCOMMIT = "overcommit"  # admit on live use plus headroom; park, offload, preempt


@dataclass(frozen=True, slots=True, kw_only=True)
class GovernorConfig:
    """Keyword-only, validated at construction; every field has a sane default.

    ``max_concurrent`` is derived from the backend's real capacity,
    ``floor(available_blocks * safety_factor / blocks_per_seq)``; set it here only to cap
    it lower. ``aging_s``: a waiting lease gains one priority level per ``aging_s``
    seconds waited, so nobody starves behind a stream of higher-priority work.

    Idle agents: a lease waiting on a tool call or on its children for ``park_after_s``
    is parked (it stops counting against the limits; 0 parks at once). Its context's KV
    is held between calls for up to ``retain_s`` (0: never held), so the next call reuses
    it; while blocks in use exceed ``pressure_watermark`` of the pool, held KV is
    offloaded to host memory and restored before the lease's next call.
    """

    mode: AdmissionMode = AdmissionMode.GUARANTEED
    safety_factor: float = DEFAULT_SAFETY_FACTOR
    headroom_ratio: float = 0.25  # overcommit: live use x (1 + headroom) must fit
    expected_use: float = DEFAULT_EXPECTED_USE  # overcommit: a new lease's size, of its ceiling
    default_ceiling_tokens: int = 8_192
    max_concurrent: int | None = None
    max_per_agent: int | None = None  # active leases of one agent name
    max_per_tenant: int | None = None  # active leases of one tenant
    aging_s: float = 10.0
    admission_timeout_s: float | None = None  # None: wait as long as it takes
    park_after_s: float = 0.5  # a lease idle on a tool or its children this long is parked
    retain_s: float = 5.0  # its KV is held between calls this long at most
    pressure_watermark: float = 0.9  # of the pool: above it, idle KV is offloaded
    reply_reserve_tokens: int = 256  # room kept for a reply when a call names no max_tokens

    def __post_init__(self) -> None:
        if not isinstance(self.mode, AdmissionMode):
            modes = ", ".join(m.value for m in AdmissionMode)
            raise ConfigError(
                f"mode must be an AdmissionMode ({modes}), got {self.mode!r}", setting="mode"
            )
        if not finite_number(self.safety_factor) or not 0 < self.safety_factor <= 1:
            raise ConfigError.safety_factor_out_of_range(self.safety_factor)
        if not finite_number(self.headroom_ratio) or self.headroom_ratio < 0:
            raise ConfigError(
                f"headroom_ratio must be a number >= 0, got {self.headroom_ratio!r}; 0.25 "
                "keeps a quarter of the live use in reserve for growth",
                setting="headroom_ratio",
            )
        if not finite_number(self.expected_use) or not 0 < self.expected_use <= 1:
            raise ConfigError(
                f"expected_use must be a fraction in (0, 1], got {self.expected_use!r}; it is "
                "how much of its ceiling a new lease is expected to use (0.2: 3k of 16k)",
                setting="expected_use",
            )
        _at_least("default_ceiling_tokens", self.default_ceiling_tokens, 1)
        _at_least("reply_reserve_tokens", self.reply_reserve_tokens, 1)
        for setting in ("park_after_s", "retain_s"):
            value = getattr(self, setting)
            if not finite_number(value) or value < 0:
                raise ConfigError(
                    f"{setting} must be a number of seconds >= 0, got {value!r}", setting=setting
                )
        if not finite_number(self.pressure_watermark) or not 0 < self.pressure_watermark <= 1:
            raise ConfigError(
                f"pressure_watermark must be a fraction in (0, 1], got "
                f"{self.pressure_watermark!r}; 0.9 offloads idle agents' KV once 90% of the "
                "blocks are in use",
                setting="pressure_watermark",
            )
        for setting in ("max_concurrent", "max_per_agent", "max_per_tenant"):
            value = getattr(self, setting)
            if value is not None:
                _at_least(setting, value, 1)
        for setting in ("aging_s", "admission_timeout_s"):
            value = getattr(self, setting)
            if value is not None and (not finite_number(value) or value <= 0):
                raise ConfigError(
                    f"{setting} must be a number of seconds > 0, got {value!r}", setting=setting
                )


def finite_number(value: object) -> bool:
    """A finite int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _at_least(setting: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError.below_minimum(setting, value, minimum)
