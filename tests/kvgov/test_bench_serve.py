"""``kvgov bench serve --quick``: the three figures with their targets and notes, and what a
wrong figure would break: the overhead's two sides ran on one engine and did the same work
on it (the same 16 tokens, the same cache state), equal streamed totals, and nothing
outlives the run (the server process, its requests, budgets, leases). One quick run (a
real server process, the real engine with the tiny model) serves every test here; no
timing is asserted."""

from __future__ import annotations

import math
import os
import re

import pytest

from engine.benchmarks import Direction
from kvgov.benchmarks.serve import ServeFacts, ServeSizes
from kvgov.benchmarks.server_process import ServerProcess
from kvgov.cli import BENCHMARKS
from tests import background

_SIZES = ServeSizes.of(quick=True)


def background_child() -> background.Child:
    """The quick measurement in a child process, run beside the suite
    (``tests/background.py``)."""
    return background.call("kvgov.benchmarks.serve.measure", quick=True)


@pytest.fixture(scope="module")
def facts() -> ServeFacts:
    measured = background.returned(__name__, background_child)
    assert isinstance(measured, ServeFacts)
    return measured


@pytest.mark.background
def test_three_figures_with_their_targets(facts: ServeFacts) -> None:
    figures = {m.metric: m for m in facts.measurements}
    assert list(figures) == [
        "http_overhead_ms_p50",
        "stream_tokens_per_s_32",
        "governed_remote_over_local",
    ]
    expected = {
        "http_overhead_ms_p50": ("ms", 2.0, Direction.LOWER_IS_BETTER),
        "stream_tokens_per_s_32": ("x", 0.85, Direction.HIGHER_IS_BETTER),
        "governed_remote_over_local": ("x", 1.10, Direction.LOWER_IS_BETTER),
    }
    for metric, (unit, target, direction) in expected.items():
        m = figures[metric]
        assert m.bench == "serve"
        assert (m.unit, m.target, m.direction) == (unit, target, direction)
        if metric == "http_overhead_ms_p50" and math.isnan(m.value):
            # only noise may leave it unmeasured here: the sides were comparable
            assert m.met is None and m.note.startswith("NOT MEASURED: the served calls")
        else:
            assert math.isfinite(m.value) and m.met is not None
        # Every note says what ran: the model, the blocks and the threads of both sides.
        assert "tiny-random on CPU, 16,384 blocks" in m.note
        assert re.search(r"\d+ torch threads in each process", m.note), m.note
    assert f"over {_SIZES.pairs} alternating pairs" in figures["http_overhead_ms_p50"].note
    overhead = figures["http_overhead_ms_p50"].note
    assert "of 16 tokens" in overhead
    assert "minus LocalBackend.generate inside the server's process" in overhead
    assert "both on the server's one engine" in overhead
    assert "each call less its engine's own time for it" in overhead
    stream = figures["stream_tokens_per_s_32"].note
    assert f"32 concurrent clients, {_SIZES.stream_tokens} max tokens each" in stream
    governed = figures["governed_remote_over_local"].note
    assert f"median of {_SIZES.governed_pairs} alternating pairs" in governed
    assert "planner + 20 ReAct workers" in governed and "left held" not in governed
    assert BENCHMARKS["serve"] == "kvgov.benchmarks.serve"


@pytest.mark.background
def test_every_overhead_call_made_exactly_16_tokens(facts: ServeFacts) -> None:
    # Warm-ups and timed pairs, on both sides: a shorter answer on one side would make
    # the difference measure the engine, not HTTP.
    assert facts.completion_tokens == [16] * (2 * (_SIZES.warmups + _SIZES.pairs))


@pytest.mark.background
def test_the_overheads_sides_ran_on_one_engine_and_gave_one_answer(facts: ServeFacts) -> None:
    """The in-process calls ran on the engine the HTTP calls reached (one instance id for
    both), and every timed call on either side gave the same greedy answer with the same
    cached tokens: the difference of their times is HTTP's, not two engines' or caches'."""
    instances = {instance for _, instance in facts.overhead_instances}
    assert {side for side, _ in facts.overhead_instances} == {"local", "remote"}
    assert len(instances) == 1 and "" not in instances
    local, remote = facts.overhead_answers["local"], facts.overhead_answers["remote"]
    assert len(local) == len(remote) == 1 and local == remote
    (answer,) = local
    assert (answer.completion_tokens, answer.finish_reason) == (16, "length")
    (remote_answer,) = remote
    assert answer.cached_tokens == remote_answer.cached_tokens > 0  # both warm


def test_sides_that_are_not_comparable_give_no_figure() -> None:
    """Two engines, two answers, or calls cut short: the figure is NaN and says why."""
    from governor import GenerationResult
    from kvgov.benchmarks.serve import why_not_comparable

    def result(tokens: tuple[int, ...], cached: int = 16) -> GenerationResult:
        return GenerationResult("x", tokens, "length", 20, len(tokens), cached)

    same = {"local": {result((1,) * 16)}, "remote": {result((1,) * 16)}}
    one_engine = {("local", "a"), ("remote", "a")}
    assert why_not_comparable(same, one_engine, tokens=16) == ""
    two_engines = {("local", "a"), ("remote", "b")}
    assert "did not run on one engine" in why_not_comparable(same, two_engines, tokens=16)
    answers = {"local": {result((1,) * 16)}, "remote": {result((2,) * 16)}}
    assert "2 different answers" in why_not_comparable(answers, one_engine, tokens=16)
    cold = {"local": {result((1,) * 16, cached=0)}, "remote": {result((1,) * 16)}}
    assert "2 different answers" in why_not_comparable(cold, one_engine, tokens=16)
    short = {"local": {result((1,) * 8)}, "remote": {result((1,) * 8)}}
    assert "made 8 tokens" in why_not_comparable(short, one_engine, tokens=16)


@pytest.mark.background
def test_both_sides_streamed_the_same_tokens(facts: ServeFacts) -> None:
    local, remote = facts.stream_totals["local"], facts.stream_totals["remote"]
    assert len(local) == len(remote) == _SIZES.stream_pairs
    assert len({*local, *remote}) == 1
    assert local[0] <= 32 * _SIZES.stream_tokens
    note = next(m.note for m in facts.measurements if m.metric == "stream_tokens_per_s_32")
    assert f"{local[0]:,} tokens per run" in note


@pytest.mark.background
def test_nothing_is_left_in_the_server_or_the_governors(facts: ServeFacts) -> None:
    after = facts.server_after
    assert after is not None
    assert (after.num_requests_running, after.num_requests_waiting) == (0, 0)
    assert after.num_blocks_in_use == 0
    assert facts.server_budgets_after == 0
    assert not facts.leases_held


@pytest.mark.background
def test_the_server_process_is_gone_after_the_run(facts: ServeFacts) -> None:
    assert facts.server_pid is not None
    with pytest.raises(ProcessLookupError):  # reaped: no such process any more
        os.kill(facts.server_pid, 0)


def test_an_interrupted_benchmark_stops_its_server() -> None:
    server = ServerProcess(model="tiny-random", num_blocks=16, threads=1)
    with pytest.raises(KeyboardInterrupt), server:
        assert server.process is not None and server.process.poll() is None
        raise KeyboardInterrupt
    assert server.process is not None and server.process.poll() is not None


def test_an_interrupted_benchmark_stops_its_serve_child() -> None:
    from kvgov.benchmarks.serve_child import ServeChild

    child = ServeChild(model="tiny-random", num_blocks=16, threads=1)
    with pytest.raises(KeyboardInterrupt), child:
        assert child.process is not None and child.process.poll() is None
        raise KeyboardInterrupt
    assert child.process is not None and child.process.poll() is not None


def _pairs(outside: list[float], engine: list[float]) -> list[tuple[float, float]]:
    return [(o + e, e) for o, e in zip(outside, engine, strict=True)]


def test_the_overhead_is_the_paired_difference_outside_the_engine() -> None:
    """Each call less its engine time, paired: the engine's scatter (here 100 vs 140 ms
    on alternate pairs) leaves the figure, which is remote's 1.5 ms outside the engine
    less local's 0.5 ms; the whole calls' median difference keeps the scatter."""
    from kvgov.benchmarks.serve import split_overhead

    engine = [0.100 if i % 2 else 0.140 for i in range(21)]
    local = _pairs([0.0005] * 21, engine)
    remote = _pairs([0.0015] * 21, engine[1:] + engine[:1])
    split = split_overhead(local, remote)
    assert split.invalid == ""
    assert split.overhead_s == pytest.approx(0.001)
    assert split.overhead_error_s == pytest.approx(0.0, abs=1e-12)
    assert split.wall_error_s > 0.005  # the whole calls' difference keeps the scatter
    assert split.outside_ms("remote") == "1.50" and split.outside_ms("local") == "0.50"


def test_an_overhead_below_zero_beyond_its_error_is_not_reported() -> None:
    """HTTP cannot make a call faster: remote less local outside the engine well below
    zero means the two sides ran unlike, and the figure says so instead of passing."""
    from kvgov.benchmarks.serve import split_overhead

    engine = [0.1] * 21
    near_zero = [0.004, -0.003, 0.002, 0.001, -0.001, 0.003, 0.000] * 3
    split = split_overhead(_pairs([0.0] * 21, engine), _pairs(near_zero, engine))
    assert split.overhead_s == pytest.approx(0.001) and split.invalid == ""
    unlike = [-0.020 + 0.0001 * i for i in range(21)]
    split = split_overhead(_pairs([0.0] * 21, engine), _pairs(unlike, engine))
    assert math.isnan(split.overhead_s) and "HTTP never speeds a call up" in split.invalid


def test_an_engine_slowed_by_serving_leaves_no_figure() -> None:
    """The figure leaves the engine's time out, so it is reported only while the served
    calls' engine time is no longer than the in-process calls'; a missing engine time
    (a server that does not report it) leaves no figure either."""
    from kvgov.benchmarks.serve import split_overhead

    local = _pairs([0.0005] * 21, [0.100 + 0.001 * (i % 3) for i in range(21)])
    slowed = _pairs([0.0015] * 21, [0.110 + 0.001 * (i % 3) for i in range(21)])
    split = split_overhead(local, slowed)
    assert math.isnan(split.overhead_s) and "serving may have slowed the engine" in split.invalid
    missing = [*slowed[:-1], (0.1, math.nan)]
    split = split_overhead(local, missing)
    assert math.isnan(split.overhead_s) and "without the engine's time" in split.invalid


@pytest.mark.background
def test_every_overhead_call_reports_an_engine_time_within_the_call(facts: ServeFacts) -> None:
    """The engine's own time comes with every call on both sides (usage.kvgov_engine_ms
    over HTTP) and is part of the call: positive and shorter than the whole call."""
    assert set(facts.overhead_calls) == {"local", "remote"}
    for side, calls in facts.overhead_calls.items():
        assert len(calls) == _SIZES.pairs, side
        for wall, engine in calls:
            assert 0 < engine < wall, (side, wall, engine)
