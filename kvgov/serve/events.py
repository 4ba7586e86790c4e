"""``EventLog``: the server's last events (requests started, finished, aborted, refused;
budgets opened and closed; KV offloaded and restored; prefixes pinned), for the live page.

Bounded: the oldest fall off. Any thread or event loop may record at once; the lock is a
leaf (nothing else is taken while it is held).
"""

from __future__ import annotations

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
        self._events: deque[Event] = deque(maxlen=max_events)
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def record(self, kind: str, **fields: Any) -> Event:
        with self._lock:
            event = Event(next(self._seq), time.time(), kind, fields)
            self._events.append(event)
        return event

    def since(self, seq: int = 0) -> list[Event]:
        """The events after ``seq``, oldest first (all that are kept for 0)."""
        with self._lock:
            return [event for event in self._events if event.seq > seq]
