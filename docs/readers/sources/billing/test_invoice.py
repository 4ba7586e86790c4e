from decimal import Decimal

import pytest
from invoice import apply_discount, parse_amount, split_evenly


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12", "12.00"),
        ("$12", "12.00"),
        (" 7.5 ", "7.50"),
        ("1,234.50", "1234.50"),
        ("0.005", "0.01"),
        ("$1,000,000", "1000000.00"),
        ("19.999", "20.00"),
        ("1.234,56", "1234.56"),
    ],
)
def test_parse_amount(text, expected):
    assert parse_amount(text) == Decimal(expected)


@pytest.mark.parametrize("cents", range(0, 10_000, 150))
@pytest.mark.parametrize("code", [None, "welcome10"])
def test_discount_never_raises_total(cents, code):
    total = Decimal(cents) / 100
    assert apply_discount(total, code) <= total


@pytest.mark.parametrize(
    ("total", "people"),
    [("10.00", 2), ("9.00", 3), ("120.00", 4), ("7.50", 5), ("100.00", 3), ("0.00", 6)],
)
def test_split_evenly_sums_to_total(total, people):
    shares = split_evenly(Decimal(total), people)
    assert len(shares) == people
    assert sum(shares) == Decimal(total)


def test_split_evenly_rejects_no_people():
    with pytest.raises(ValueError, match="at least 1"):
        split_evenly(Decimal("5.00"), 0)
