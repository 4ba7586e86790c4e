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

llama-server has no cache salt, so a slot is also what keeps tenants apart: a call on a
slot that last held another tenant's KV (another ``cache_salt``) must not reuse it
(``begin`` says so), or the new tenant's prompt could hit the old one's cached prefix,
and its latency tell what the other sent.

A slot saved to the server's disk (``offload``) goes to the file ``slot_filename`` names:
a BLAKE2 digest of the backend (its URL and a random id of its own), the budget's cache
salt and the budget, behind a readable stem of the budget's name. Two backends on one
server, two tenants, or two budgets whose names differ only in characters a file name
cannot hold (``研究员`` and ``分析师``, ``a/b`` and ``a b``) never write one file, so a
restore loads only the KV its own budget saved.

Thread-safe; ``_lock`` is a leaf.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
from dataclasses import dataclass

__all__ = ["SlotTable", "slot_filename"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")  # llama-server takes ASCII names; no dots, no paths
_STEM_CHARS = 32


def slot_filename(*, backend: str, cache_salt: str | None, budget: str) -> str:
    """The file the budget's slot is saved to on the server: ``kvgov-{stem}-{digest}.bin``,
    the digest (BLAKE2b, 128 bits) of all three, the stem the budget's name made safe
    (for a person reading the folder; the digest alone tells files apart)."""
    key = json.dumps([backend, cache_salt, budget], ensure_ascii=True).encode("ascii")
    digest = hashlib.blake2b(key, digest_size=16, person=b"kvgov-slot-file").hexdigest()
    stem = _UNSAFE.sub("_", budget)[:_STEM_CHARS] or "_"
    return f"kvgov-{stem}-{digest}.bin"


_TAINTED = object()  # the tenant of a slot a switching call failed on: nobody's


@dataclass(slots=True)
class _Slot:
    owner: str | None = None
    used: int = 0  # when its owner last sent a call (a logical clock)
    calls: int = 0  # its owner's calls in flight
    held: bool = False  # retained: not given to another budget
    tenant: object = None  # the cache salt of the KV it holds (kept after its owner leaves)
    used_ever: bool = False


class SlotTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[int, _Slot] = {}
        self._clock = itertools.count(1)
        self._tenants: dict[str, str | None] = {}  # budget -> its calls' cache salt

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

    def tenant_of(self, budget: str) -> str | None:
        """The cache salt of the budget's last call (None: none, or no call yet)."""
        with self._lock:
            return self._tenants.get(budget)

    def begin(self, budget: str, tenant: str | None = None) -> tuple[int | None, bool]:
        """The budget's slot for a call (assigned at its first; None without a free one),
        and whether it must be erased first: it holds another tenant's KV."""
        with self._lock:
            slot_id = self._find(budget)
            if slot_id is None:
                slot_id = self._take(budget)
                if slot_id is None:
                    return None, False
            slot = self._slots[slot_id]
            erase = slot.used_ever and slot.tenant != tenant
            slot.calls += 1
            slot.used = next(self._clock)
            slot.tenant, slot.used_ever = tenant, True
            self._tenants[budget] = tenant
            return slot_id, erase

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
        """A slot for ``budget`` now (a restore of its own KV), assigned to it."""
        with self._lock:
            slot_id = self._find(budget)
            if slot_id is None:
                slot_id = self._take(budget)
            if slot_id is not None:
                slot = self._slots[slot_id]
                slot.tenant, slot.used_ever = self._tenants.get(budget), True
            return slot_id

    def taint_of(self, budget: str) -> None:
        """The budget's slot may still hold another tenant's KV: its next call must not
        reuse it."""
        with self._lock:
            slot_id = self._find(budget)
            if slot_id is not None:
                self._slots[slot_id].tenant = _TAINTED
                self._slots[slot_id].used_ever = True

    def erased(self, slot_id: int) -> None:
        """The slot's KV was erased: it holds no tenant's."""
        with self._lock:
            if slot_id in self._slots:
                self._slots[slot_id].tenant = None
                self._slots[slot_id].used_ever = False

    def release(self, budget: str, *, closed: bool = False) -> int | None:
        """The budget gives its slot up (``closed``, or its KV saved); returns the slot."""
        with self._lock:
            if closed:
                self._tenants.pop(budget, None)
            slot_id = self._find(budget)
            if slot_id is not None:
                slot = self._slots[slot_id]
                self._slots[slot_id] = _Slot(tenant=slot.tenant, used_ever=slot.used_ever)
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
        previous = self._slots[slot_id]
        self._slots[slot_id] = _Slot(
            owner=budget, tenant=previous.tenant, used_ever=previous.used_ever
        )
        return slot_id
