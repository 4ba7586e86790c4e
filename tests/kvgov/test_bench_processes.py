"""``kvgov bench processes --quick`` for real: a redis-server the benchmark starts itself,
4 child processes on one ``RedisStore`` namespace, the LangGraph run on both stores. What
a wrong figure would break: each figure is its samples' statistic (derived here again),
every Redis lease reached the server, the 4 processes shared one ledger (their leases
overlapped on it, never more than one each), the ledgers are empty after each part, the
children exited cleanly, the run's keys are gone, and the table prints every row. One
quick run, in a child beside the suite (``tests/background.py``), serves every test
here; no timing is asserted."""

from __future__ import annotations

import math
import shutil
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.benchmarks import Direction, Measurement
from kvgov import cli
from kvgov.benchmarks import processes
from kvgov.benchmarks.processes import NUM_PROCESSES, ProcessesFacts, ProcessesSizes
from kvgov.benchmarks.redis_server import ENV_URL, redis_server
from kvgov.cli import BENCHMARKS
from kvgov.cli.output import format_number
from tests import background
from tests.redis_server import RedisServer, need_redis_server

_SIZES = ProcessesSizes.of(quick=True)
_EMPTY = (0, 0, 0, 0)
runner = CliRunner()


def background_child() -> background.Child | None:
    """The quick measurement in a child process, beside the suite; none without a
    redis-server (the test then skips, or fails under CI)."""
    if shutil.which("redis-server") is None:
        return None
    return background.call("kvgov.benchmarks.processes.measure", quick=True)


@pytest.fixture(scope="module")
def facts() -> ProcessesFacts:
    need_redis_server()
    measured = background.returned(__name__, background_child)
    assert isinstance(measured, ProcessesFacts)
    return measured


def _figures(facts: ProcessesFacts) -> dict[str, Measurement]:
    return {m.metric: m for m in facts.measurements}


def _percentile(values: list[float], p: int) -> float:
    """Linear interpolation between the closest ranks, as numpy's default."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@pytest.mark.background
def test_four_figures_with_their_targets(facts: ProcessesFacts) -> None:
    figures = _figures(facts)
    assert list(figures) == [
        "admission_rtt_ms_p50",
        "admission_rtt_ms_p99",
        "leases_per_s",
        "governed_redis_over_local",
    ]
    expected = {
        "admission_rtt_ms_p50": ("ms", 1.0, Direction.LOWER_IS_BETTER),
        "admission_rtt_ms_p99": ("ms", 5.0, Direction.LOWER_IS_BETTER),
        "leases_per_s": ("leases/s", 2_000, Direction.HIGHER_IS_BETTER),
        "governed_redis_over_local": ("x", 1.10, Direction.LOWER_IS_BETTER),
    }
    for metric, (unit, target, direction) in expected.items():
        m = figures[metric]
        assert (m.bench, m.unit, m.target, m.direction) == ("processes", unit, target, direction)
        assert math.isfinite(m.value) and m.value > 0 and m.met is not None
        assert facts.server in m.note  # every note says what served
    assert "redis-server" in facts.server or ENV_URL in facts.server
    assert BENCHMARKS["processes"] == "kvgov.benchmarks.processes"


@pytest.mark.background
def test_the_round_trips_are_their_samples_percentiles(facts: ProcessesFacts) -> None:
    figures = _figures(facts)
    for store in ("redis", "local"):
        assert len(facts.rtt_s[store]) == _SIZES.samples
        assert all(s > 0 for s in facts.rtt_s[store])
    p50, p99 = (_percentile(facts.rtt_s["redis"], p) * 1e3 for p in (50, 99))
    assert figures["admission_rtt_ms_p50"].value == pytest.approx(p50, rel=1e-9)
    assert figures["admission_rtt_ms_p99"].value == pytest.approx(p99, rel=1e-9)
    assert p99 >= p50
    assert p50 == pytest.approx(statistics.median(facts.rtt_s["redis"]) * 1e3, rel=1e-9)
    # LocalStore's, beside it in the note
    local = {p: _percentile(facts.rtt_s["local"], p) * 1e3 for p in (50, 99)}
    assert f"LocalStore {local[50]:.3f} ms" in figures["admission_rtt_ms_p50"].note
    assert f"LocalStore {local[99]:.3f} ms" in figures["admission_rtt_ms_p99"].note
    # every Redis lease reached the server (a LocalStore by mistake would make none)
    assert facts.script_calls >= _SIZES.samples
    assert facts.ledgers["rtt"] == _EMPTY


@pytest.mark.background
def test_four_processes_shared_one_ledger(facts: ProcessesFacts) -> None:
    assert [w.store for w in facts.windows] == ["redis", "local"] * _SIZES.rounds
    for window in facts.windows:
        assert len(window.counts) == NUM_PROCESSES and min(window.counts) > 0
        assert window.ended - window.started >= _SIZES.window_s  # each ran its whole window
        assert window.cpu_s > 0
    redis_rates = [sum(w.counts) / (w.ended - w.started) for w in facts.windows[::2]]
    figure = _figures(facts)["leases_per_s"]
    assert figure.value == pytest.approx(statistics.median(redis_rates), rel=1e-9)
    local_rates = [sum(w.counts) / (w.ended - w.started) for w in facts.windows[1::2]]
    assert f"{statistics.median(local_rates):,.0f}/s" in figure.note
    # one lease at a time in each process, and their leases overlapped on the one ledger
    assert 2 <= facts.peak_active <= NUM_PROCESSES
    assert f"peak: {facts.peak_active} leases active at once" in figure.note
    assert facts.ledgers["leases"] == _EMPTY
    assert facts.exit_codes == [0] * NUM_PROCESSES


@pytest.mark.background
def test_the_governed_ratio_is_its_pairs_median(facts: ProcessesFacts) -> None:
    times = facts.governed_s
    assert len(times["redis"]) == len(times["local"]) == _SIZES.pairs
    ratios = [r / lo for lo, r in zip(times["local"], times["redis"], strict=True)]
    figure = _figures(facts)["governed_redis_over_local"]
    assert figure.value == pytest.approx(statistics.median(ratios), rel=1e-9)
    for store in ("redis", "local"):
        assert f"{statistics.median(times[store]) * 1e3:.1f} ms" in figure.note
    assert f"median of {_SIZES.pairs} alternating pairs" in figure.note
    assert not facts.leases_held and "left held" not in figure.note
    assert facts.ledgers["graph"] == _EMPTY


@pytest.mark.background
def test_the_runs_keys_are_deleted(facts: ProcessesFacts) -> None:
    assert facts.keys_deleted > 0  # the parts' namespaces were on that server
    assert facts.keys_left == 0


@pytest.mark.background
def test_the_table_prints_every_figure(
    facts: ProcessesFacts, monkeypatch: pytest.MonkeyPatch
) -> None:
    def measured(*, quick: bool = False) -> Iterator[Measurement]:
        return iter(facts.measurements)

    monkeypatch.setattr(processes, "run", measured)
    result = runner.invoke(cli.app, ["bench", "processes"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    metrics = [m.metric for m in facts.measurements]
    rows = {  # a row's first line; a note's wrapped line may also start with "processes"
        cells[1]: " ".join(cells)
        for cells in (line.split() for line in result.stdout.splitlines())
        if cells[:1] == ["processes"] and cells[1:2] and cells[1] in metrics
    }
    assert list(rows) == metrics
    for m in facts.measurements:
        sign = ">=" if m.direction is Direction.HIGHER_IS_BETTER else "<="
        assert (
            f" {format_number(m.value)} {m.unit} {sign} {format_number(m.target or 0)} "
            in (rows[m.metric])
        )
        assert ("✓" if m.met else "✗") in rows[m.metric]


def test_a_temporary_server_is_stopped_on_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    need_redis_server()
    monkeypatch.delenv(ENV_URL, raising=False)
    with redis_server() as at:
        assert at.process is not None and at.process.poll() is None
        assert at.url.startswith("redis://127.0.0.1:") and "temporary redis-server" in at.label
    assert at.process.poll() is not None


def test_kvgov_redis_url_points_it_at_a_running_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = RedisServer(tmp_path).start()
    try:
        monkeypatch.setenv(ENV_URL, server.url)
        with redis_server() as at:
            assert (at.url, at.process) == (server.url, None)  # nothing started
            assert f"({ENV_URL})" in at.label
    finally:
        server.kill()


def test_without_redis_server_it_says_how_to_install_it(tmp_path: Path) -> None:
    result = runner.invoke(
        cli.app,
        ["bench", "processes", "--quick"],
        env={"PATH": str(tmp_path), ENV_URL: None},  # an empty folder: no redis-server
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "apt-get install redis-server" in result.stderr
    assert ENV_URL in result.stderr
