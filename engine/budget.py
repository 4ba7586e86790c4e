"""A named cap on the blocks that a group of sequences may hold."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

from engine.errors import (
    BudgetInUseError,
    DuplicateBudgetError,
    InvalidRequestError,
    UnknownBudgetError,
)
from engine.validation import require_int

__all__ = ["Budget", "BudgetInfo", "BudgetRegistry"]


@dataclass(slots=True, eq=False)
class Budget:
    """Charged one block per block-table entry of each member sequence.

    Shared blocks (forks, prefix-cache hits) are charged to every sequence that holds
    them: the cap then bounds the group's worst case, which is what a guarantee needs,
    since any shared partial block may be copied on write. Swapped-out sequences stay
    charged, so swapping back in never fails on the budget.
    """

    name: str
    max_blocks: int
    num_blocks: int = 0
    seq_ids: set[Hashable] = field(default_factory=set)

    @property
    def num_free_blocks(self) -> int:
        return self.max_blocks - self.num_blocks

    def info(self) -> BudgetInfo:
        return BudgetInfo(
            name=self.name,
            max_blocks=self.max_blocks,
            num_blocks=self.num_blocks,
            num_sequences=len(self.seq_ids),
        )


@dataclass(frozen=True, slots=True)
class BudgetInfo:
    name: str
    max_blocks: int
    num_blocks: int
    num_sequences: int


class BudgetRegistry:
    """The open budgets, by name."""

    __slots__ = ("_budgets",)

    def __init__(self) -> None:
        self._budgets: dict[str, Budget] = {}

    def open(self, name: str, *, max_blocks: int) -> BudgetInfo:
        require_int("max_blocks", max_blocks, minimum=0)
        if name in self._budgets:
            raise DuplicateBudgetError(name)
        budget = self._budgets[name] = Budget(name=name, max_blocks=max_blocks)
        return budget.info()

    def resize(self, name: str, *, max_blocks: int) -> BudgetInfo:
        """Grow or shrink the cap; never below what the group already holds."""
        require_int("max_blocks", max_blocks, minimum=0)
        budget = self.get(name)
        if max_blocks < budget.num_blocks:
            raise InvalidRequestError(
                f"budget {name!r} holds {budget.num_blocks} block(s); it cannot shrink to "
                f"{max_blocks} until its sequences free some"
            )
        budget.max_blocks = max_blocks
        return budget.info()

    def close(self, name: str) -> None:
        budget = self.get(name)
        if budget.seq_ids:
            raise BudgetInUseError(name, len(budget.seq_ids))
        del self._budgets[name]

    def get(self, name: str) -> Budget:
        try:
            return self._budgets[name]
        except KeyError:
            raise UnknownBudgetError(name) from None

    def __iter__(self) -> Iterator[Budget]:
        return iter(self._budgets.values())

    def __len__(self) -> int:
        return len(self._budgets)
