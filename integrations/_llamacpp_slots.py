"""``SlotTable``: which llama-server slot each budget (each agent's lease) is served on.

llama-server keeps one sequence's KV per slot and reuses it for the next request sent
there whose prompt starts the same (``cache_prompt``); a request with ``id_slot`` goes
to that slot. So each budget gets a slot of its own at its first call and keeps it: an
agent's next turn finds its prompt where it left it, and tenants never share a slot's
cache while they have slots to themselves. With more budgets than slots, a budget's
first call takes a free slot if one is, else the one used least recently by a budget
that has no call in flight and holds nothing (``retain``); that budget's next call is
served elsewhere and prefills again. Budgets whose KV was saved (``offload``) own no
slot until restored.

Thread-safe; ``_lock`` is a leaf.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

__all__ = ["SlotTable"]


@dataclass(slots=True)
class _Slot:
    owner: str | None = None
    used: int = 0  # when its owner last sent a call (a logical clock)
    calls: int = 0  # its owner's calls in flight
    held: bool = False  # retained: not given to another budget


class SlotTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[int, _Slot] = {}
        self._clock = itertools.count(1)

    def resize(self, slot_ids: list[int]) -> None:
        """The server's slots (read from ``/props`` or ``/slots``)."""
        with self._lock:
            for slot_id in slot_ids:
                self._slots.setdefault(slot_id, _Slot())
            for slot_id in set(self._slots) - set(slot_ids):
                del self._slots[slot_id]

    def slot_of(self, budget: str) -> int | None:
        with self._lock:
            return self._find(budget)

    def begin(self, budget: str) -> int | None:
        """The budget's slot for a call (assigned at its first); None without a free one."""
        with self._lock:
            slot_id = self._find(budget)
            if slot_id is None:
                slot_id = self._take(budget)
                if slot_id is None:
                    return None
            slot = self._slots[slot_id]
            slot.calls += 1
            slot.used = next(self._clock)
            return slot_id

    def end(self, budget: str) -> None:
        with self._lock:
            slot_id = self._find(budget)
            if slot_id is not None:
                self._slots[slot_id].calls = max(0, self._slots[slot_id].calls - 1)

    def hold(self, budget: str, held: bool) -> int | None:
        with self._lock:
            slot_id = self._find(budget)
            if slot_id is not None:
                self._slots[slot_id].held = held
            return slot_id

    def take_for(self, budget: str) -> int | None:
        """A slot for ``budget`` now (a restore), assigned to it."""
        with self._lock:
            return self._find(budget) if self._find(budget) is not None else self._take(budget)

    def release(self, budget: str) -> int | None:
        """The budget gives its slot up (closed, or its KV saved); returns the slot."""
        with self._lock:
            slot_id = self._find(budget)
            if slot_id is not None:
                self._slots[slot_id] = _Slot()
            return slot_id

    def forget(self) -> None:
        """The server restarted: every slot's KV is gone, and every assignment with it."""
        with self._lock:
            for slot_id in self._slots:
                self._slots[slot_id] = _Slot()

    def owners(self) -> dict[int, str | None]:
        with self._lock:
            return {slot_id: slot.owner for slot_id, slot in self._slots.items()}

    def _find(self, budget: str) -> int | None:
        for slot_id, slot in self._slots.items():
            if slot.owner == budget:
                return slot_id
        return None

    def _take(self, budget: str) -> int | None:
        free = [i for i, s in self._slots.items() if s.owner is None]
        idle = [i for i, s in self._slots.items() if s.owner and not s.calls and not s.held]
        choices = free or sorted(idle, key=lambda i: self._slots[i].used)
        if not choices:
            return None
        slot_id = min(free) if free else choices[0]
        self._slots[slot_id] = _Slot(owner=budget)
        return slot_id
