"""The host link: one queue of KV copies between device and host memory, timed by a
device profile.

A copy of ``num_bytes`` takes ``host_link_latency_s + num_bytes /
host_link_bandwidth_bytes_s``. Copies run one at a time, in the order charged: a copy
charged at ``at`` starts then if the link is idle, else when the copy before it finishes.
Both directions share the one queue (the engine issues its copies on one stream), and the
link keeps each direction's bytes and busy seconds apart: offloads (device to host) and
restores (host to device).

Errors (caller input)::

    InvalidRequestError (engine.errors)
    └── LinkError   a copy of a negative or non-integer size, or at a time not finite

Torch-free.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from engine.errors import InvalidRequestError
from engine.twin.profiles import DeviceProfile

__all__ = ["Direction", "HostLink", "LinkError", "LinkTotals"]


class LinkError(InvalidRequestError):
    """A copy the link cannot charge."""


class Direction(enum.Enum):
    OFFLOAD = "offload"  # device to host: offloads, preemption swaps, holds moved out
    RESTORE = "restore"  # host to device: restores, swaps back in


@dataclass(frozen=True, slots=True)
class LinkTotals:
    """One direction's copies so far."""

    num_copies: int = 0
    num_bytes: int = 0
    busy_s: float = 0.0


@dataclass(slots=True, kw_only=True)
class HostLink:
    """The queue of copies over one profile's host link."""

    profile: DeviceProfile
    _free_at: float = field(init=False, default=0.0)
    _totals: dict[Direction, LinkTotals] = field(init=False, default_factory=dict)

    @property
    def free_at(self) -> float:
        """When the last copy charged so far finishes (0.0 before any)."""
        return self._free_at

    def duration(self, num_bytes: int) -> float:
        """Seconds one copy of ``num_bytes`` holds the link."""
        p = self.profile
        return p.host_link_latency_s + num_bytes / p.host_link_bandwidth_bytes_s

    def charge(self, num_bytes: int, *, at: float, direction: Direction) -> float:
        """Queue a copy of ``num_bytes`` issued at time ``at``; returns when it finishes.
        A copy of no bytes is no copy: it costs nothing and finishes at ``at``."""
        if not isinstance(num_bytes, int) or isinstance(num_bytes, bool) or num_bytes < 0:
            raise LinkError(f"a copy moves an int >= 0 of bytes, got {num_bytes!r}")
        if not math.isfinite(at):
            raise LinkError(f"a copy is issued at a finite time, got {at!r}")
        if not isinstance(direction, Direction):
            raise LinkError(f"a copy's direction is a Direction, got {direction!r}")
        if num_bytes == 0:
            return at
        seconds = self.duration(num_bytes)
        self._free_at = max(at, self._free_at) + seconds
        before = self.totals(direction)
        self._totals[direction] = LinkTotals(
            num_copies=before.num_copies + 1,
            num_bytes=before.num_bytes + num_bytes,
            busy_s=before.busy_s + seconds,
        )
        return self._free_at

    def totals(self, direction: Direction) -> LinkTotals:
        return self._totals.get(direction, LinkTotals())
