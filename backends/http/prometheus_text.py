"""``parse_exposition``: Prometheus' text exposition format, read without prometheus_client.

The probes of external engines (vLLM's and SGLang's ``/metrics``) read this format on an
agent box that installed plain ``kvgov``; ``prometheus_client`` ships with the ``serve``
extra only, so it cannot be relied on here. What a probe needs is small: every sample's
name, labels and value, and each family's declared type. The grammar read (text format
0.0.4, and the OpenMetrics lines an engine may add):

    # HELP name docstring         (skipped)
    # TYPE name counter|gauge|... (kept: the family's type)
    # EOF / any other comment     (skipped)
    name{label="value",...} value [timestamp]

Label values unescape ``\\\\``, ``\\"`` and ``\\n``; values are floats (``NaN``,
``+Inf``, ``-Inf`` included; a probe reads ``finite()``, where they are absent). A line
that does not parse is counted in ``num_malformed`` and skipped, never raised: one odd
line must not cost the probe every other figure of the scrape.
``tests/backends/http/test_prometheus_text.py`` holds this parser to prometheus_client's
own output.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Exposition", "Sample", "parse_exposition"]

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Exposition:
    samples: tuple[Sample, ...] = ()
    types: Mapping[str, str] = field(default_factory=dict)  # family name -> type
    num_malformed: int = 0

    def named(self, name: str) -> list[Sample]:
        """The samples called ``name`` exactly (a counter's ``_total``, not its family)."""
        return [sample for sample in self.samples if sample.name == name]

    def has(self, name: str) -> bool:
        return any(sample.name == name for sample in self.samples)

    def finite(self) -> Exposition:
        """The exposition less its NaN and infinite samples: what a probe reads, so that
        an engine's NaN gauge or infinite counter is a figure it does not have (and
        never reaches ``int()`` or a sum)."""
        kept = tuple(sample for sample in self.samples if math.isfinite(sample.value))
        return Exposition(samples=kept, types=self.types, num_malformed=self.num_malformed)


def parse_exposition(text: str) -> Exposition:
    samples: list[Sample] = []
    types: dict[str, str] = {}
    num_malformed = 0
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        sample = _sample(line)
        if sample is None:
            num_malformed += 1
        else:
            samples.append(sample)
    return Exposition(samples=tuple(samples), types=types, num_malformed=num_malformed)


def _sample(line: str) -> Sample | None:
    brace = line.find("{")
    space = _first_space(line)
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        parsed = _labels(line, brace + 1)
        if parsed is None:
            return None
        labels, end = parsed
        rest = line[end:]
    else:
        if space == -1:
            return None
        name, labels, rest = line[:space], {}, line[space:]
    fields = rest.split()
    if not name or not 1 <= len(fields) <= 2 or not _is_name(name):
        return None
    value = _float(fields[0])
    if value is None:
        return None
    return Sample(name=name, labels=labels, value=value)


def _labels(line: str, start: int) -> tuple[dict[str, str], int] | None:
    """The labels from ``start`` (just past ``{``) and the index just past ``}``."""
    labels: dict[str, str] = {}
    i, n = start, len(line)
    while i < n:
        while i < n and line[i] in " ,":
            i += 1
        if i < n and line[i] == "}":
            return labels, i + 1
        equals = line.find("=", i)
        if equals == -1 or equals + 1 >= n or line[equals + 1] != '"':
            return None
        key = line[i:equals].strip()
        if not _is_name(key):
            return None
        value: list[str] = []
        i = equals + 2
        while i < n and line[i] != '"':
            if line[i] == "\\" and i + 1 < n:
                value.append(_ESCAPES.get(line[i + 1], "\\" + line[i + 1]))
                i += 2
            else:
                value.append(line[i])
                i += 1
        if i >= n:
            return None  # the value's closing quote is missing
        labels[key] = "".join(value)
        i += 1
    return None


def _first_space(line: str) -> int:
    for i, char in enumerate(line):
        if char in " \t":
            return i
    return -1


def _is_name(name: str) -> bool:
    return all(char.isalnum() or char in "_:" for char in name) and not name[0].isdigit()


def _float(text: str) -> float | None:
    try:
        return float(text)  # "NaN", "+Inf" and "-Inf" included
    except ValueError:
        return None
