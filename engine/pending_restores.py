"""``PendingRestores``: requests waiting for their budget's offloaded context to come back.

An agent's context was offloaded to host memory while it waited on a tool; its next
request arrives when the device has no room to bring it back. Ending the hold there
would make the request compute the whole context again; instead the request waits,
held (the scheduler skips it), and each step tries the restore first, before anything
else is scheduled, as a swapped request comes back before new ones are admitted. Once
the context is back in the prefix cache the request is released to the scheduler and
reuses it.

A request also waits here when the engine moved its budget's hold to host memory after
the request had arrived (``moved``: the room went to a request ahead of it, or to a
running one); without that, it would be admitted with its context on the host and
compute it all again.

A restore takes its turn: it is tried only when no request ahead of its own in the
scheduling order waits unheld, so bringing a context back never takes the room the
queue's head needs (which would stall it, the engine would move the hold out again, and
so on). A restore never stalls the engine: when nothing runs and nothing else can be
scheduled, the engine first moves other holds out of the way, and then gives the oldest
pending restore up (its hold ends, its request computes its context again).
Single-threaded, as the engine that owns it.
"""

from __future__ import annotations

from collections.abc import Sequence

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

    def moved(self, budget: str, queue: Sequence[Request]) -> None:
        """The engine moved ``budget``'s hold to host memory: its next request, when it
        is in ``queue`` (the scheduler's waiting requests) already, waits for it."""
        mine = [r for r in queue if r.budget == budget and not r.held]
        if mine and self._retained.is_offloaded(budget):
            self.add(budget, min(mine, key=Request.sort_key))

    def try_restore(self, queue: Sequence[Request] = ()) -> None:
        """Bring back every context whose turn it is in ``queue`` (the scheduler's
        waiting requests) and that fits now; release their requests. A request that
        ended, or whose hold ended meanwhile (budget closed), stops waiting."""
        still: list[tuple[str, Request]] = []
        for budget, request in self._waiting:
            gone = request.is_finished or budget not in self._retained.held_budgets()
            if gone or (_its_turn(request, queue) and self._retained.restore(budget)):
                request.held = False
            else:
                still.append((budget, request))
        self._waiting = still

    def would_restore(self, queue: Sequence[Request] = ()) -> bool:
        """Whether ``try_restore(queue)`` would change anything now: bring a context
        back, or let a request that stopped waiting go. It changes nothing."""
        held = self._retained.held_budgets()
        for budget, request in self._waiting:
            if request.is_finished or budget not in held:
                return True
            if _its_turn(request, queue) and self._retained.can_restore(budget):
                return True
        return False

    def give_up_oldest(self) -> bool:
        """End the oldest pending restore's hold (its request computes the context again);
        False when none is pending."""
        if not self._waiting:
            return False
        budget, request = self._waiting.pop(0)
        self._retained.release(budget)
        request.held = False
        return True


def _its_turn(request: Request, queue: Sequence[Request]) -> bool:
    """No request ahead of ``request`` in the scheduling order waits to be admitted."""
    key = request.sort_key()
    return not any(not other.held and other.sort_key() < key for other in queue)
