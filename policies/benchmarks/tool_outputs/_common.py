"""What the generators share: output sizes, uniform placement, names, ids and clocks.

Sizes are log-uniform over ``MIN_TOKENS``-``MAX_TOKENS`` cl100k tokens, estimated from
characters with each format's own characters-per-token ratio (measured once on the
generated text) so that generation never runs a tokenizer. Every random draw goes
through the case's own ``random.Random``.
"""

from __future__ import annotations

import math
import random
import re
import string
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import TypeVar

T = TypeVar("T")

MIN_TOKENS = 1_500
MAX_TOKENS = 20_000

FIRST_NAMES = tuple(
    re.findall(
        r"[\w-]+",
        "ana ben chloe dmitri elena farid grace hiro ines jonas kavya liam mei nora omar "
        "priya quentin rosa sven tara umar vera wei ximena yusuf zoe aiko bruno carmen diego",
    )
)
LAST_NAMES = tuple(
    re.findall(
        r"[\w-]+",
        "alvarez brandt chen dubois eriksen fischer garcia haddad ito jensen kowalski lopez "
        "moreau novak okafor petrov quinn rossi sato tanaka ueda vargas weber xu yilmaz zhang "
        "bianchi costa",
    )
)
DOMAINS = ("example.com", "acme.io", "globex.net", "initech.co", "umbrella.org", "hooli.dev")
ORGS = ("acme", "globex", "initech", "hooli", "umbrella", "stark-labs", "wayne-tech")
SERVICES = tuple(
    re.findall(
        r"[\w-]+",
        "checkout billing orders catalog search notify ledger ingest accounts shipping "
        "inventory pricing reports gateway auth media",
    )
)
REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "eu-central-1", "ap-south-1", "ap-northeast-1")
NOUNS = tuple(
    re.findall(
        r"[\w-]+",
        "order invoice user session token config event batch report webhook payment customer "
        "shipment refund schedule snapshot cart price account tenant export upload coupon "
        "ledger",
    )
)
VERBS = tuple(
    re.findall(
        r"[\w-]+",
        "parse create update delete retry validate serialize render load merge resolve "
        "refresh cancel export list fetch apply sync",
    )
)
QUALIFIERS = tuple(
    re.findall(
        r"[\w-]+",
        "empty invalid unicode timeout concurrent large missing_key expired partial duplicate "
        "negative zero rounding legacy utc paginated",
    )
)

_ALNUM = string.ascii_letters + string.digits
_LOWER_ALNUM = string.ascii_lowercase + string.digits


def num_chars(rng: random.Random, chars_per_token: float) -> int:
    """Characters of an output whose size in tokens is log-uniform over the range.

    ``chars_per_token`` is each format's own, calibrated on its generated text against
    cl100k; it also absorbs how far a generator's running size estimate is from the
    text it finally prints (markup, padding, headers), so it is a scale, not a ratio a
    reader could check by dividing.
    """
    tokens = math.exp(rng.uniform(math.log(MIN_TOKENS), math.log(MAX_TOKENS)))
    return int(tokens * chars_per_token)


def fill(make: Callable[[], T], num_chars: int, size: Callable[[T], int]) -> list[T]:
    """Items from ``make`` until their sizes (``size`` + 1 for a newline) reach ``num_chars``."""
    items: list[T] = []
    total = 0
    while total < num_chars:
        item = make()
        items.append(item)
        total += size(item) + 1
    return items


def plant(rng: random.Random, items: list[T], planted: Iterable[T]) -> None:
    """Inserts each planted item at a position drawn uniformly over ``items`` (in place)."""
    for item in planted:
        items.insert(rng.randrange(len(items) + 1), item)


def hexid(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def alnum(rng: random.Random, n: int, *, lower: bool = False) -> str:
    return "".join(rng.choice(_LOWER_ALNUM if lower else _ALNUM) for _ in range(n))


def uuid4(rng: random.Random) -> str:
    h = hexid(rng, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{rng.choice('89ab')}{h[17:20]}-{h[20:]}"


def ipv4(rng: random.Random, *, private: bool = True) -> str:
    if private:
        return f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
    first = rng.choice((23, 34, 52, 81, 91, 104, 145, 176, 185, 198, 203, 212))
    return f"{first}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"


def person(rng: random.Random) -> tuple[str, str]:
    return rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)


def login(rng: random.Random) -> str:
    first, last = person(rng)
    return rng.choice((f"{first}{last[0]}", f"{first}-{last}", f"{first[0]}{last}", first + last))


def email(rng: random.Random) -> str:
    first, last = person(rng)
    local = rng.choice((f"{first}.{last}", f"{first[0]}{last}", f"{first}{rng.randint(1, 99)}"))
    return f"{local}@{rng.choice(DOMAINS)}"


def pick(rng: random.Random, pool: Sequence[T], k: int) -> list[T]:
    return rng.sample(list(pool), k)


class Unique:
    """Draws values that were not drawn before (ids, names), so a planted key is the only one."""

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self._seen = set(taken)

    def __call__(self, make: Callable[[], str]) -> str:
        for _ in range(10_000):
            value = make()
            if value not in self._seen:
                self._seen.add(value)
                return value
        raise AssertionError("ran out of distinct values")  # a pool far too small


class Clock:
    """Timestamps that move forward in small random steps, as log lines do."""

    def __init__(self, rng: random.Random, *, step_s: tuple[float, float] = (0.0, 2.0)) -> None:
        day = datetime(2024, 1, 8, tzinfo=timezone.utc) + timedelta(days=rng.randrange(300))
        self.now = day + timedelta(seconds=rng.randrange(3_600, 20 * 3_600))
        self._rng = rng
        self._step = step_s

    def tick(self) -> datetime:
        self.now += timedelta(seconds=self._rng.uniform(*self._step))
        return self.now


def iso_ms(t: datetime) -> str:
    """2024-05-12T10:31:02.114Z"""
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def log_ms(t: datetime, sep: str = ",") -> str:
    """2024-05-12 10:31:02,114 (Python logging) or with "." (logback)."""
    return t.strftime("%Y-%m-%d %H:%M:%S") + f"{sep}{t.microsecond // 1000:03d}"


def snake(*parts: str) -> str:
    return "_".join(parts)


def camel(*parts: str) -> str:
    words = "_".join(parts).split("_")
    return words[0] + "".join(w.title() for w in words[1:])


def pascal(*parts: str) -> str:
    return "".join(w.title() for w in "_".join(parts).split("_"))
