"""``Session``: what a ``RemoteBackend`` has set up on the server, kept to set it up again
after the server restarts.

A server restart loses every budget, pin and held context. The client notices it by the
server's instance id changing (the ``x-kvgov-instance`` header, ``/version``), then opens
its budgets again at their last sizes and pins its prefixes again; the ``PrefixHandle``
keys the governor holds are the client's own, mapped to the server's current keys, so
they stay valid. Held KV is gone: the backend's restart hooks tell the governor, which
forgets those holds. A budget closed (or a pin unpinned) while the server could not be
reached is closed once it can be, if it is the same server; a new one never had it.

Thread-safe; ``lock`` is a leaf (no call is made under it).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Pin", "Session"]


@dataclass(slots=True)
class Pin:
    prefix: str | list[int] | list[dict[str, Any]]
    cache_salt: str | None
    server_key: str
    shared: bool = False


@dataclass(slots=True)
class Session:
    instance: str | None = None
    # Check the instance before the next call: a call failed to reach the server, so it
    # may have restarted.
    suspect: bool = True
    restart_pending: bool = False  # seen a new instance; budgets and pins not set up again
    num_restarts: int = 0
    budgets: dict[str, int] = field(default_factory=dict)  # name -> max_blocks
    pins: dict[str, Pin] = field(default_factory=dict)  # client key -> pin
    pending_closes: set[str] = field(default_factory=set)  # budgets
    pending_unpins: set[str] = field(default_factory=set)  # server keys
    lock: threading.Lock = field(default_factory=threading.Lock)
    _keys: itertools.count = field(default_factory=itertools.count)

    def observe(self, instance: str) -> None:
        """The server answered as ``instance``."""
        with self.lock:
            if instance == self.instance:
                return
            if self.instance is not None:
                self.restart_pending = True
                # What was left to close there went with it.
                self.pending_closes.clear()
                self.pending_unpins.clear()
            self.instance = instance

    def new_key(self) -> str:
        return f"remote-prefix-{next(self._keys)}"

    def opened(self, name: str, max_blocks: int) -> None:
        with self.lock:
            self.budgets[name] = max_blocks
            self.pending_closes.discard(name)

    def closed(self, name: str, *, reached: bool) -> None:
        """The budget is closed for the client; ``reached``: the server was told."""
        with self.lock:
            known = self.budgets.pop(name, None) is not None
            if known and not reached:
                self.pending_closes.add(name)

    def pinned(self, key: str, pin: Pin) -> None:
        with self.lock:
            self.pins[key] = pin

    def unpinned(self, key: str, *, reached: bool) -> Pin | None:
        with self.lock:
            pin = self.pins.pop(key, None)
            if pin is not None and not reached:
                self.pending_unpins.add(pin.server_key)
            return pin

    def server_key(self, key: str) -> str | None:
        with self.lock:
            pin = self.pins.get(key)
            return None if pin is None else pin.server_key

    def to_restore(self) -> tuple[dict[str, int], dict[str, Pin]]:
        with self.lock:
            return dict(self.budgets), dict(self.pins)

    def take_pending(self) -> tuple[Sequence[str], Sequence[str]]:
        with self.lock:
            closes, unpins = sorted(self.pending_closes), sorted(self.pending_unpins)
            self.pending_closes.clear()
            self.pending_unpins.clear()
            return closes, unpins

    @property
    def has_pending(self) -> bool:
        return bool(self.pending_closes or self.pending_unpins)
