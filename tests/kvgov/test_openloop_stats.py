"""Issue 34's statistics: paired bootstrap intervals over seeds, the best baseline, goodput
and each job's SLO. Synthetic figures with known answers; no engine runs."""

from __future__ import annotations

import math
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from kvgov.benchmarks.openloop.stats import (
    SLO_FACTOR,
    CurveLengthError,
    FigureValueError,
    Interval,
    MissingSloError,
    SeedMismatchError,
    StatsInputError,
    StatsSettingError,
    TooFewSeedsError,
    band_over,
    best_of,
    goodput_per_min,
    median_interval,
    paired_ratio,
    run_goodput_per_min,
    slo_s_by_job,
)

ROOT = Path(__file__).resolve().parents[2]


def _paired_figures(num_seeds: int, *, rng: random.Random, ratio_sigma: float, mu: float = 0.0):
    """Figures of two policies on the same seeds: each seed's workload scales both (a
    spread of about 10x between seeds), and the policies' ratio varies by ``ratio_sigma``
    (log scale) around exp(mu), its true median."""
    denom, numer = {}, {}
    for s in range(num_seeds):
        workload = rng.lognormvariate(0.0, 1.0)
        denom[s] = workload
        numer[s] = workload * rng.lognormvariate(mu, ratio_sigma)
    return numer, denom


def _unpaired_ratio_interval(numer, denom, *, resamples: int, seed: int) -> tuple[float, float]:
    """What ignoring the pairing would give: each policy's median resampled on its own."""
    rng = random.Random(seed)
    a, b = list(numer.values()), list(denom.values())
    ratios = sorted(
        statistics.median(rng.choices(a, k=len(a))) / statistics.median(rng.choices(b, k=len(b)))
        for _ in range(resamples)
    )
    cut = resamples // 40
    return ratios[cut], ratios[resamples - 1 - cut]


def test_equal_ratios_give_that_ratio_with_a_zero_width_interval() -> None:
    denom = {s: 10.0 + 7 * s for s in range(10)}
    numer = {s: 2.0 * d for s, d in denom.items()}
    interval = paired_ratio(numer, denom)
    assert (interval.value, interval.low, interval.high) == (2.0, 2.0, 2.0)
    assert (interval.level, interval.num_seeds) == (0.95, 10)
    assert str(interval) == "2.00 (2.00-2.00, 95%, 10 seeds)"


def test_the_ratio_is_the_median_of_per_seed_ratios_not_the_ratio_of_medians() -> None:
    numer = {0: 1.0, 1: 10.0, 2: 100.0}
    denom = {0: 1.0, 1: 1.0, 2: 100.0}  # per seed: 1, 10, 1; medians: 10 over 1
    assert paired_ratio(numer, denom, resamples=200).value == 1.0


def test_pairing_keeps_the_interval_narrow_where_each_side_alone_varies_widely() -> None:
    numer, denom = _paired_figures(12, rng=random.Random(7), ratio_sigma=0.01, mu=math.log(2))
    assert max(denom.values()) / min(denom.values()) > 10  # each side alone varies widely

    paired = paired_ratio(numer, denom, resamples=2_000, seed=3)
    low, high = _unpaired_ratio_interval(numer, denom, resamples=2_000, seed=3)

    assert paired.low <= 2.0 <= paired.high
    assert paired.high - paired.low < 0.05
    assert high - low > 1.0  # the ratio of two independently resampled medians


def test_the_interval_is_deterministic_given_its_seed() -> None:
    numer, denom = _paired_figures(10, rng=random.Random(1), ratio_sigma=0.5)
    first = paired_ratio(numer, denom, seed=5)
    assert paired_ratio(numer, denom, seed=5) == first
    # The seeds' order in the mapping does not move the draws.
    assert paired_ratio(dict(reversed(numer.items())), denom, seed=5) == first
    assert paired_ratio(numer, denom, seed=6) != first


def test_the_95_interval_covers_the_true_median_in_about_95_of_experiments() -> None:
    # 200 experiments of 10 seeds each, the per-seed ratio lognormal with median 1.5. A
    # percentile bootstrap of a median undercovers a little at 10 seeds, hence 85-99%;
    # 400 resamples per experiment instead of 10,000 keep the test under a second.
    rng = random.Random(2026)
    true_median = 1.5
    num_covered = 0
    for experiment in range(200):
        numer, denom = _paired_figures(10, rng=rng, ratio_sigma=0.3, mu=math.log(true_median))
        interval = paired_ratio(numer, denom, resamples=400, seed=experiment)
        num_covered += interval.low <= true_median <= interval.high
    assert 0.85 <= num_covered / 200 <= 0.99, num_covered


def test_median_interval_of_one_figure() -> None:
    values = {s: float(v) for s, v in enumerate([5, 1, 4, 2, 3])}
    interval = median_interval(values, resamples=1_000)
    assert interval.value == 3.0
    assert 1.0 <= interval.low < 3.0 < interval.high <= 5.0
    constant = median_interval({0: 7.0, 1: 7.0}, resamples=100)
    assert (constant.low, constant.value, constant.high) == (7.0, 7.0, 7.0)


def test_band_over_resamples_whole_curves_by_seed() -> None:
    # Every seed's curve is its seed's scale times (1, 2, 3): on any one resample of seeds
    # the medians at the three points stay in that proportion, so the bands do too.
    curves = {s: [k * (1.0 + s) for k in (1, 2, 3)] for s in range(9)}
    band = band_over(curves, resamples=500, seed=4)
    assert [b.value for b in band] == [5.0, 10.0, 15.0]
    assert [b.low for b in band] == [band[0].low * k for k in (1, 2, 3)]
    assert [b.high for b in band] == [band[0].high * k for k in (1, 2, 3)]
    assert band[0].low < 5.0 < band[0].high
    assert band[1] == median_interval({s: c[1] for s, c in curves.items()}, resamples=500, seed=4)


def test_best_of_picks_by_median_over_seeds_and_breaks_ties_by_name() -> None:
    candidates = {
        "paged+offload": {0: 10.0, 1: 10.0, 2: 10.0},
        # The lowest figure on two seeds of three, but not the lowest median.
        "ttl-pin": {0: 1.0, 1: 30.0, 2: 11.0},
        "intercept": {0: 12.0, 1: 9.0, 2: 12.0},
    }
    assert best_of(candidates, lower_is_better=True) == "paged+offload"
    assert best_of(candidates, lower_is_better=False) == "intercept"
    tied = {"b": {0: 1.0, 1: 2.0}, "a": {0: 2.0, 1: 1.0}}
    assert best_of(tied, lower_is_better=True) == "a"
    assert best_of(tied, lower_is_better=False) == "a"


def _slo(seconds: float, *jobs: str) -> dict[str, float]:
    return dict.fromkeys(jobs, seconds)


def test_goodput_counts_jobs_within_the_slo_and_never_a_failed_job() -> None:
    jct = {"a": 10.0, "b": 20.0, "c": 25.0, "d": 40.0}  # c is at the SLO: it counts
    slo = _slo(25.0, *jct)
    assert goodput_per_min(jct, 0, 60.0, slo) == 3.0
    assert goodput_per_min(jct, 5, 60.0, slo) == 3.0  # failed jobs did not finish
    assert goodput_per_min(jct, 0, 120.0, slo) == 1.5
    assert goodput_per_min({}, 3, 60.0, slo) == 0.0


def test_a_job_is_good_at_exactly_twice_its_own_unloaded_time_and_not_above() -> None:
    assert SLO_FACTOR == 2.0
    unloaded = {"at": 1.7, "above": 1.7, "small": 4.0, "large": 400.0}
    jct = {
        "at": 3.4,  # 2 x 1.7, exactly
        "above": math.nextafter(3.4, math.inf),  # the next float past it
        # Each job is held to its own size: a short job twice as slow as alone misses,
        # though it finished long before the large job's SLO (800 s).
        "small": 10.0,
        "large": 700.0,
    }
    slo = slo_s_by_job(unloaded)
    assert slo == {"at": 3.4, "above": 3.4, "small": 8.0, "large": 800.0}
    good = goodput_per_min(jct, 0, 60.0, slo)
    assert good == 2.0  # "at" and "large"
    assert goodput_per_min({"at": 3.4}, 2, 60.0, slo) == 1.0  # failed jobs never count
    assert slo_s_by_job(unloaded, factor=3.0)["small"] == 12.0


def test_run_goodput_is_all_finished_jobs_or_nothing_by_the_runs_p99() -> None:
    jct = {"a": 10.0, "b": 20.0, "c": 25.0}
    assert run_goodput_per_min(jct, 0, 60.0, _slo(25.0, *jct)) == 3.0
    # The p99 of each job over its own SLO: c at 25 s against 24 s misses.
    assert run_goodput_per_min(jct, 0, 60.0, _slo(24.0, *jct)) == 0.0
    assert run_goodput_per_min(jct, 0, 60.0, {"a": 5.0, "b": 20.0, "c": 25.0}) == 0.0
    assert run_goodput_per_min(jct, 1, 60.0, _slo(25.0, *jct)) == 0.0  # a failed job
    # With 200 jobs the p99 is the 198th: one failure among them leaves it in time.
    many = {f"j{i}": 1.0 for i in range(199)}
    assert run_goodput_per_min(many, 1, 60.0, _slo(2.0, *many)) == 199.0
    assert run_goodput_per_min(many, 3, 60.0, _slo(2.0, *many)) == 0.0


_A = {"a": 2.0}  # job a's SLO


@pytest.mark.parametrize(
    ("call", "error", "says"),
    [
        (lambda: paired_ratio({0: 1.0, 1: 1.0}, {0: 1.0, 2: 1.0}), SeedMismatchError, "same seeds"),
        (lambda: paired_ratio({0: 1.0}, {0: 1.0}), TooFewSeedsError, "at least 2 seeds"),
        (lambda: paired_ratio({0: 1, 1: 1}, {0: 1, 1: 0.0}), FigureValueError, "positive denom"),
        (lambda: paired_ratio({0: 1, 1: 1}, {0: 1, 1: -2.0}), FigureValueError, "positive denom"),
        (lambda: paired_ratio({0: 1, 1: 1}, {0: 1, 1: math.nan}), FigureValueError, "finite"),
        (lambda: paired_ratio({0: 1, 1: math.inf}, {0: 1, 1: 1}), FigureValueError, "finite"),
        (lambda: paired_ratio({0: 1, 1: 1}, {0: 1, 1: 1}, resamples=0), StatsSettingError, "int"),
        (lambda: paired_ratio({0: 1, 1: 1}, {0: 1, 1: 1}, level=95), StatsSettingError, "0.95"),
        (lambda: median_interval({0: 1.0}), TooFewSeedsError, "more evaluation seeds"),
        (lambda: median_interval({0: 1.0, 1: math.nan}), FigureValueError, "seed 1"),
        (lambda: band_over({0: [1.0, 2.0], 1: [1.0]}), CurveLengthError, "same x points"),
        (lambda: band_over({0: [], 1: []}), CurveLengthError, "same x points"),
        (lambda: best_of({}, lower_is_better=True), StatsSettingError, "at least one"),
        (
            lambda: best_of({"a": {0: 1.0}, "b": {1: 1.0}}, lower_is_better=True),
            SeedMismatchError,
            "'a' and 'b'",
        ),
        (lambda: best_of({"a": {0: math.nan}}, lower_is_better=True), FigureValueError, "'a'"),
        (lambda: goodput_per_min({"a": 1.0}, -1, 60.0, _A), StatsSettingError, "num_failed"),
        (lambda: goodput_per_min({"a": 1.0}, 0, 0.0, _A), StatsSettingError, "window_s"),
        (lambda: goodput_per_min({"a": 1.0}, 0, 60.0, 2.0), StatsSettingError, "slo_s_by_job"),
        (
            lambda: goodput_per_min({"a": 1.0}, 0, 60.0, {"a": math.nan}),
            StatsSettingError,
            "slo_s['a']",
        ),
        (lambda: goodput_per_min({"a": 1.0, "b": 1.0}, 0, 60.0, _A), MissingSloError, "['b']"),
        (lambda: goodput_per_min({"a": math.inf}, 0, 60.0, _A), FigureValueError, "num_failed"),
        (lambda: run_goodput_per_min({"a": -1.0}, 0, 60.0, _A), FigureValueError, "job 'a'"),
        (lambda: run_goodput_per_min({"b": 1.0}, 0, 60.0, _A), MissingSloError, "unloaded"),
        (lambda: slo_s_by_job({}), StatsSettingError, "unloaded time"),
        (lambda: slo_s_by_job({"a": 1.0, "b": math.nan}), StatsSettingError, "unloaded_s['b']"),
        (lambda: slo_s_by_job({"a": 0.0}), StatsSettingError, "> 0"),
        (lambda: slo_s_by_job({"a": 1.0}, factor=0.0), StatsSettingError, "factor"),
    ],
)
def test_bad_input_gets_a_typed_error_that_says_what_to_do(call, error, says) -> None:
    with pytest.raises(error, match=".*".join(map(re.escape, says.split()))) as raised:
        call()
    assert isinstance(raised.value, StatsInputError)
    assert isinstance(raised.value, ValueError)


def test_the_statistics_import_and_run_without_torch() -> None:
    # The figures are computed where the runs' results are read, which need not have torch.
    check = (
        "import sys\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'engine'):\n"
        "            raise ModuleNotFoundError(name + ' is blocked by the test')\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "from kvgov.benchmarks.openloop import stats\n"
        "print(stats.paired_ratio({0: 2.0, 1: 4.0}, {0: 1.0, 1: 2.0}, resamples=10))\n"
        "print(stats.goodput_per_min({'a': 1.0}, 0, 60.0, stats.slo_s_by_job({'a': 1.0})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split("\n")[:2] == ["2.00 (2.00-2.00, 95%, 2 seeds)", "1.0"]


def test_an_interval_reads_as_value_band_level_and_seeds() -> None:
    interval = Interval(value=1.3241, low=1.18, high=1.449, level=0.95, num_seeds=10)
    assert str(interval) == "1.32 (1.18-1.45, 95%, 10 seeds)"
    assert str(Interval(value=1, low=0.5, high=2, level=0.9, num_seeds=12)).endswith(
        "(0.50-2.00, 90%, 12 seeds)"
    )
