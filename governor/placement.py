"""``Placement``: where a lease's blocks go, for a backend that is several engines in one.

The governor's admission counts one pool: the sum of the backend's blocks. A backend
made of several replicas (``backends.MultiBackend``) is that sum, but a lease runs
on one replica, so it fits only where one replica has room for all of it. Such a
backend offers ``placement(safety_factor=...)``, and guaranteed-mode admission asks it
as well as the sum:

- ``max_blocks()``: the most blocks one lease could ever be placed with (the largest
  replica's limit); a lease larger is refused at once with ``AdmissionRejected``, as
  one larger than the sum is;
- ``can_place(budget, num_blocks)``: a replica has room for it now (else the lease
  waits, holding the line, exactly as when the sum is full);
- ``place(budget, num_blocks)``: reserve that room on one replica (the one chosen then,
  preferring the replica the budget was on before: an agent's context stays where it is
  cached); called as the lease becomes active, or comes back at a new ceiling;
- ``unplace(budget)``: the lease stopped being active (parked, released); the room is
  free, the replica it was on is remembered.

The four are called under the admission lock, so a check and its act see the same
state; they must be bookkeeping in memory, never I/O, and call nothing back (a leaf
lock at most: the governor's lock order in ``governor.lifecycle``). Overcommit mode does
not use them: it admits on live use, and the backend routes by free blocks instead.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Placement"]


@runtime_checkable
class Placement(Protocol):
    def max_blocks(self) -> int: ...

    def can_place(self, budget: str, num_blocks: int) -> bool: ...

    def place(self, budget: str, num_blocks: int) -> None: ...

    def unplace(self, budget: str) -> None: ...
