"""Amounts, discounts and splits for customer invoices."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")
DISCOUNTS = {"WELCOME10": Decimal("0.10"), "TEAM25": Decimal("0.25"), "VIP": Decimal("0.30")}


def parse_amount(text: str) -> Decimal:
    """'1,234.50', '$12', ' 7.5 ' -> Decimal rounded to cents."""
    cleaned = text.strip().removeprefix("$").replace(",", "")
    return Decimal(cleaned).quantize(CENT, rounding=ROUND_HALF_UP)


def apply_discount(total: Decimal, code: str | None) -> Decimal:
    if not code:
        return total
    rate = DISCOUNTS[code.upper()]
    return (total * (1 - rate)).quantize(CENT, rounding=ROUND_HALF_UP)


def split_evenly(total: Decimal, people: int) -> list[Decimal]:
    """Each person's share; the shares add up to the total."""
    if people < 1:
        raise ValueError(f"people must be at least 1, got {people}")
    share = (total / people).quantize(CENT, rounding=ROUND_HALF_UP)
    return [share] * people
