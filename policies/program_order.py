"""Programs first come, first served: an agent's calls go in the order its program began.

``ProgramOrder`` ranks a waiting lease by its *program*: the top of its parent chain (a
planner's lease for its workers, the lease itself without a parent). Within a priority,
the program requested first goes first, and within a program the lease requested first.
A lease that parked on a tool and queues again for its next call keeps its program's
place, ahead of every program begun after it; so do a planner's workers, whenever they
are requested.

Why: under memory pressure every call that waits holds its whole program back, and a
program is done only when its last call is. Serving each call as it comes back (the
default, ``PriorityWithAging``, ages a re-queued lease from its new queue time) shares
memory among every program begun, so all of them run slowly and finish late together;
serving the oldest program's calls first finishes programs one after another, and the
mean time to finish one drops. This is the order Continuum (program-level first come,
first served, arXiv 2511.02230 §4.3) and InferCept (a resumed call keeps its original
arrival, ICML 2024) both serve in; the bundled engine orders its own queue the same
way (``Lease.root_requested_at`` is each call's ``order_time``).

Priority still goes first, with aging: a lease's effective priority is its
``priority`` plus one level per ``aging_s`` seconds since its *program* was requested,
so an old program of low priority overtakes high-priority programs begun well after it
(``aging_s`` seconds a level), and nothing starves: each program's place is fixed when
it begins, and older ones finish.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from governor import Lease, PriorityWithAging

__all__ = ["ProgramOrder"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramOrder:
    """An ``AdmissionPolicy``: highest effective priority first, then the oldest program
    (see the module docstring)."""

    aging_s: float = 10.0

    def __post_init__(self) -> None:
        PriorityWithAging(aging_s=self.aging_s)  # the default's check of aging_s, its error

    def order(
        self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float
    ) -> list[Lease]:
        return sorted(waiting, key=self.key)

    def key(self, lease: Lease) -> tuple[float, int, int]:
        """A lease's place never changes while it waits (every program ages alike), so
        the controller keeps its queue in this order instead of calling ``order`` on
        every pass."""
        program = lease
        while program.parent is not None:
            program = program.parent
        age = program.requested_at / self.aging_s
        return (age - lease.priority, program.arrival, lease.arrival)
