"""``Placement``: where a lease's blocks go, for a backend that is several engines in one.

A lease runs on one replica, so guaranteed-mode admission asks a replicated backend's
placement as well as the sum: ``max_blocks`` (a lease larger is refused), ``can_place``,
``place`` and ``unplace``. All four are called under the admission lock: bookkeeping in
memory, never I/O, calling nothing back. Overcommit mode does not use them.

Their contract: docs/design/admission.md.
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
