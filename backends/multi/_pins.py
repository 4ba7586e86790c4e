"""``Pins``: the prefixes ``MultiBackend`` pinned, on every replica in rotation.

Every replica serves any agent, so a pin goes to each one, and to a replica when it comes
back; the handle the governor holds is ``MultiBackend``'s own key, mapped here to each
replica's handle. Calls to the replicas are made by the caller, outside ``lock`` (a
leaf).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from governor import BackendCapacity, BackendMetrics, BackendUnavailable, Message, PrefixHandle

__all__ = ["Pin", "Pins", "summed_capacity", "summed_metrics"]


@dataclass(slots=True)
class Pin:
    prefix: str | Sequence[int] | Sequence[Message]
    cache_salt: str | None
    shared: bool
    handles: dict[int, PrefixHandle] = field(default_factory=dict)  # replica -> its handle


class Pins:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._pins: dict[str, Pin] = {}
        self._keys = itertools.count()

    def add(self, pin: Pin) -> PrefixHandle:
        """Keep the pin (pinned on one replica at least); the governor's handle for it."""
        first = next(iter(pin.handles.values()))
        with self.lock:
            key = f"multi-prefix-{next(self._keys)}"
            self._pins[key] = pin
        return PrefixHandle(
            key=key,
            num_tokens=first.num_tokens,
            num_pinned_tokens=first.num_pinned_tokens,
            num_blocks=first.num_blocks,
            cache_salt=pin.cache_salt,
            shared=first.shared,
        )

    def pop(self, key: str) -> Pin | None:
        with self.lock:
            return self._pins.pop(key, None)

    def missing_on(self, replica: int) -> list[Pin]:
        with self.lock:
            return [pin for pin in self._pins.values() if replica not in pin.handles]

    def pinned(self, pin: Pin, replica: int, handle: PrefixHandle) -> None:
        with self.lock:
            pin.handles[replica] = handle


def summed_capacity(readings: list[BackendCapacity], *, backend: str) -> BackendCapacity:
    """The replicas' capacity as one: blocks summed, the smallest context."""
    if not readings:
        raise BackendUnavailable("no replica is in rotation", backend=backend)
    return BackendCapacity(
        block_size=readings[0].block_size,
        num_blocks=sum(r.num_blocks for r in readings),
        num_free_blocks=sum(r.num_free_blocks for r in readings),
        num_pinned_blocks=sum(r.num_pinned_blocks for r in readings),
        bytes_per_block=readings[0].bytes_per_block,
        max_model_len=min(r.max_model_len for r in readings),
        weights_bytes=sum(r.weights_bytes for r in readings),
    )


def summed_metrics(readings: list[BackendMetrics]) -> BackendMetrics:
    names = BackendMetrics.__dataclass_fields__
    return BackendMetrics(**{n: sum(getattr(m, n) for m in readings) for n in names})
