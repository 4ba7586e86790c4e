"""The probes' exposition parser reads what prometheus_client writes, as prometheus_client's
own parser reads it: the engines' recorded /metrics, and label values with every escape."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from backends.http.prometheus_text import parse_exposition

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TEXTS = sorted(FIXTURES.glob("*/*.txt"))


def _theirs(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return [
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _ours(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return [
        (s.name, tuple(sorted(s.labels.items())), s.value) for s in parse_exposition(text).samples
    ]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        x[:2] == y[:2] and (x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2])))
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recorded_engine_texts_read_as_prometheus_client_reads_them(path):
    text = path.read_text()
    assert _same(_ours(text), _theirs(text))
    assert parse_exposition(text).num_malformed == 0


def test_escapes_special_values_and_histograms_read_as_prometheus_client_reads_them():
    registry = CollectorRegistry()
    gauge = Gauge("odd:gauge", "doc with \\ and \n", ["a", "b"], registry=registry)
    gauge.labels(a='quote " here', b="back\\slash and\nnewline").set(float("nan"))
    gauge.labels(a="{braces}, commas=", b="ünï").set(float("inf"))
    gauge.labels(a="", b=" ").set(-1.5e-7)
    Counter("odd_total", "c", registry=registry).inc(3)
    Histogram("odd_seconds", "h", ["x"], buckets=[0.1, 1.0], registry=registry).labels("y").observe(
        0.5
    )
    text = generate_latest(registry).decode()
    assert _same(_ours(text), _theirs(text))
    assert parse_exposition(text).types["odd:gauge"] == "gauge"


def test_a_malformed_line_is_counted_and_skipped_and_the_rest_is_read():
    text = (
        'vllm:num_requests_running{engine="0"} 3\n'
        'vllm:broken{engine="0} 1\n'
        "vllm:no_value\n"
        "vllm:bad_value{} abc\n"
        'vllm:num_requests_waiting{engine="0",} 1 1700000000000\n'
        "# EOF\n"
    )
    exposition = parse_exposition(text)
    assert [(s.name, dict(s.labels), s.value) for s in exposition.samples] == [
        ("vllm:num_requests_running", {"engine": "0"}, 3.0),
        ("vllm:num_requests_waiting", {"engine": "0"}, 1.0),
    ]
    assert exposition.num_malformed == 3


def test_finite_leaves_out_nan_and_infinite_samples_and_keeps_the_rest():
    """What a probe reads: an engine's NaN gauge or infinite counter is a figure it does
    not have. The parser itself keeps them (prometheus_client writes them)."""
    text = "a 1\nb NaN\nc +Inf\nd -Inf\ne 2.5\n# TYPE a gauge\nbroken\n"
    exposition = parse_exposition(text)
    assert len(exposition.samples) == 5
    finite = exposition.finite()
    assert [(s.name, s.value) for s in finite.samples] == [("a", 1.0), ("e", 2.5)]
    assert finite.types == {"a": "gauge"} and finite.num_malformed == 1
