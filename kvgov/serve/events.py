"""``EventLog``: the server's last events (requests started, finished, aborted, refused;
budgets opened and closed; KV offloaded and restored; prefixes pinned), for the live page.

Bounded per tenant: each tenant (an event's ``tenant`` field; "" for the server's own
events and on a server without API keys) keeps its last ``max_events``, the oldest
falling off, so one tenant's flood of events never pushes another's out of its live page.
The seq numbers are the server's, shared by every tenant. Any thread or event loop may
record at once; the lock is a leaf (nothing else is taken while it is held).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Event", "EventLog"]


@dataclass(frozen=True, slots=True)
class Event:
    seq: int  # increases by one per event: a reader asks for what came after the last it saw
    at: float  # time.time()
    kind: str  # "request.started", "request.finished", "budget.opened", ...
    fields: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "at": self.at, "kind": self.kind, **self.fields}


class EventLog:
    def __init__(self, max_events: int = 200) -> None:
        if max_events < 1:
            raise ValueError(f"max_events must be at least 1, got {max_events}")
        self._max_events = max_events
        # One deque per tenant; their number is bounded by the server's API keys, since
        # a tenant id is only ever derived from a configured key.
        self._events: dict[str, deque[Event]] = {}
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def record(self, kind: str, **fields: Any) -> Event:
        tenant = str(fields.get("tenant") or "")
        with self._lock:
            event = Event(next(self._seq), time.time(), kind, fields)
            kept = self._events.get(tenant)
            if kept is None:
                kept = self._events[tenant] = deque(maxlen=self._max_events)
            kept.append(event)
        return event

    def since(self, seq: int = 0, *, tenant: str | None = None) -> list[Event]:
        """The events after ``seq``, oldest first (all that are kept for 0): every
        tenant's, or only ``tenant``'s."""
        with self._lock:
            if tenant is not None:
                logs = [list(self._events.get(tenant, ()))]
            else:
                logs = [list(kept) for kept in self._events.values()]
        merged = heapq.merge(*logs, key=lambda event: event.seq)
        return [event for event in merged if event.seq > seq]
