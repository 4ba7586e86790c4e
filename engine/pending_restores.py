"""``PendingRestores``: requests waiting for their budget's offloaded context to come back.

An agent's context was offloaded to host memory while it waited on a tool; its next
request arrives when the device has no room to bring it back. Ending the hold there
would make the request compute the whole context again; instead the request waits,
held (the scheduler skips it), and each step tries the restore first, before anything
else is scheduled, as a swapped request comes back before new ones are admitted. Once
the context is back in the prefix cache the request is released to the scheduler and
reuses it.

A restore never stalls the engine: when nothing runs and nothing else can be
scheduled, the engine first moves other holds out of the way, and then gives the
oldest pending restore up (its hold ends, its request computes its context again).
Single-threaded, as the engine that owns it.
"""

from __future__ import annotations

from engine.request import Request
from engine.retention import RetainedContexts

__all__ = ["PendingRestores"]


class PendingRestores:
    __slots__ = ("_retained", "_waiting")

    def __init__(self, retained: RetainedContexts) -> None:
        self._retained = retained
        self._waiting: list[tuple[str, Request]] = []  # oldest first

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def add(self, budget: str, request: Request) -> None:
        """The request waits for its budget's context to be restored."""
        request.held = True
        self._waiting.append((budget, request))

    def try_restore(self) -> None:
        """Bring back every context that fits now; release their requests. A request that
        ended, or whose hold ended meanwhile (budget closed), stops waiting."""
        still: list[tuple[str, Request]] = []
        for budget, request in self._waiting:
            gone = request.is_finished or budget not in self._retained.held_budgets()
            if gone or self._retained.restore(budget):
                request.held = False
            else:
                still.append((budget, request))
        self._waiting = still

    def give_up_oldest(self) -> bool:
        """End the oldest pending restore's hold (its request computes the context again);
        False when none is pending."""
        if not self._waiting:
            return False
        budget, request = self._waiting.pop(0)
        self._retained.release(budget)
        request.held = False
        return True
