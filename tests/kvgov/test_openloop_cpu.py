"""The CPU panel (issue 34): the real engine's short form beside the twin of this machine.

The real engine runs for real here: ``tiny-random`` computing every token, on the wall
clock, every policy of the benchmark, constrained and unconstrained, on two seeds. To keep
that to seconds the workload is one small tenant and its tools are drawn at 1 ms
(``Tool.draw_s`` patched for the fixture's build: the same short tools on both sides).
The twin runs on a stand-in for ``kvgov twin fit``'s profile file (the shipped
``cpu-here`` with its factors marked fitted): fitting takes minutes here, and no test
below asserts how close the twin comes, only that the figures compare what they say.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import pytest

from engine.twin import get_profile
from engine.twin.profiles import FACTOR_FIELDS, Source
from kvgov.benchmarks.openloop import cpu, stats
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.agreement import Agreement, AgreementError
from kvgov.benchmarks.openloop.cpu import CpuPanelError, CpuPanelRuns, ProfileNotFittedError
from kvgov.benchmarks.openloop.panel import Cell, PanelRuns
from kvgov.benchmarks.openloop.tuned import TUNED
from kvgov.benchmarks.openloop.workload_setup import WorkloadSetup

SEEDS = (1, 2)
# A path of each kind through the runs: paged through the runner unpriced, ttl-pin priced
# by costs measured on the engine and with tuned knobs, kvgov through the governor (the
# benchmark runs all five; three keep the real runs to seconds).
POLICIES = ("paged", "ttl-pin", "kvgov")
TINY = openloop.OpenLoopWorkload(
    rate_per_min=900.0,
    duration_s=0.15,
    tenants=(
        openloop.Tenant(name="bfcl", weight=1.0, workers_per_team=1, turns=(1, 2), mix="bfcl"),
    ),
    reply_tokens=(2, 4),
    tool_output_tokens=96,
    ceiling_tokens=900,
    system_tokens=200,
)
RATE = TINY.rate_per_min
# Twice the largest agent's peak (37 blocks) and a little, below every agent's peak at
# once on both seeds (164 and 260 blocks): scarce.
KV_BLOCKS = 80


def fitted_stand_in(path: Path) -> Path:
    """The shipped cpu-here profile with its step-time factors marked as fitted, written
    where a test can point the panel: a stand-in for ``kvgov twin fit``'s file."""
    shipped = get_profile("cpu-here")
    fitted = Source(field="", title="fitted", url="", figure="a stand-in for a fit, in a test")
    sources = tuple(s for s in shipped.sources if s.field not in FACTOR_FIELDS)
    sources += tuple(dataclasses.replace(fitted, field=f) for f in FACTOR_FIELDS)
    dataclasses.replace(shipped, sources=sources).save(path)
    return path


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fitted_stand_in(tmp_path_factory.mktemp("twin") / "cpu-here.json")


@pytest.fixture(scope="module")
def setups() -> dict[int, WorkloadSetup]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(openloop.Tool, "draw_s", lambda self, rng: 0.001)
        return {
            s: WorkloadSetup.of(dataclasses.replace(TINY, seed=s), block_size=16) for s in SEEDS
        }


@pytest.fixture(scope="module")
def ran(profile_file: Path) -> tuple[CpuPanelRuns, list[str]]:
    panel = cpu.cpu_here(profile=profile_file, kv_blocks=KV_BLOCKS)
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(openloop.Tool, "draw_s", lambda self, rng: 0.001)
        workloads = [dataclasses.replace(TINY, seed=s) for s in SEEDS]
        runs = cpu.run_cpu_panel(
            panel, workloads, POLICIES, knobs=TUNED, deadline_s=120.0, progress=lines.append
        )
    return runs, lines


def test_the_panel_is_this_machine_with_scarce_kv_and_bounded_host_memory(
    profile_file: Path, setups: dict[int, WorkloadSetup]
) -> None:
    panel = cpu.cpu_here(profile=profile_file, kv_blocks=KV_BLOCKS)
    s = panel.scenario
    assert s.kv_blocks == KV_BLOCKS and s.host_blocks == 3 * KV_BLOCKS
    assert s.target.shape.activation_bits == 32  # float32, as the engine runs on a CPU
    assert (
        s.profile.host_link_bandwidth_bytes_s == get_profile("cpu-here").host_link_bandwidth_bytes_s
    )
    assert all(setup.peak_blocks > KV_BLOCKS for setup in setups.values())
    # The shipped budget is scarce on every seed the benchmark reports, quick or not.
    for base, seeds in ((cpu.SHORT, cpu.SEEDS), (cpu.QUICK, cpu.QUICK_SEEDS)):
        for seed in seeds:
            setup = WorkloadSetup.of(dataclasses.replace(base, seed=seed), block_size=16)
            assert setup.peak_blocks > cpu.kv_blocks_for(base), (base.tenants[0].name, seed)
    with pytest.raises(CpuPanelError, match="host_ratio"):
        cpu.cpu_here(profile=profile_file, host_ratio=8.0)


def test_a_missing_or_unfitted_profile_says_to_run_twin_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ProfileNotFittedError, match="kvgov twin fit") as missing:
        cpu.cpu_here(profile=tmp_path / "nowhere.json")
    assert missing.value.path == tmp_path / "nowhere.json"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(ProfileNotFittedError, match=str(tmp_path / "cache")):
        cpu.cpu_here()  # where kvgov twin fit writes it
    placeholder = tmp_path / "placeholder.json"
    get_profile("cpu-here").save(placeholder)
    with pytest.raises(ProfileNotFittedError, match=r"placeholders .*kvgov twin fit"):
        cpu.cpu_here(profile=placeholder)
    other = tmp_path / "h100.json"
    get_profile("h100-sxm").save(other)
    with pytest.raises(ProfileNotFittedError, match="h100-sxm"):
        cpu.cpu_here(profile=other)


def test_the_tuning_seed_and_a_lone_seed_are_refused_before_anything_runs(tmp_path: Path) -> None:
    nowhere = tmp_path / "nowhere.json"  # no profile: a check after the seeds' would say so
    with pytest.raises(CpuPanelError, match="tuning seed"):
        next(cpu.measure((0, 1), profile=nowhere))
    with pytest.raises(CpuPanelError, match="at least two"):
        next(cpu.measure((3,), profile=nowhere))


def test_every_policy_sends_the_same_requests_on_the_real_engine_as_on_the_twin(
    ran: tuple[CpuPanelRuns, list[str]],
) -> None:
    runs, _ = ran
    for seed in SEEDS:
        sent = {
            (side, policy, unconstrained): panel.result(
                policy, RATE, seed, unconstrained=unconstrained
            ).prompts
            for side, panel in (("real", runs.real), ("twin", runs.twin))
            for policy in POLICIES
            for unconstrained in (False, True)
        }
        first = next(iter(sent.values()))
        assert first, seed
        assert all(prompts == first for prompts in sent.values()), seed
    assert runs.real.result("paged", RATE, 1).prompts != runs.real.result("paged", RATE, 2).prompts
    assert all(not r.failed for r in [*runs.real.results.values(), *runs.twin.results.values()])


def test_each_real_policy_is_divided_by_its_own_unconstrained_run(
    ran: tuple[CpuPanelRuns, list[str]], setups: dict[int, WorkloadSetup]
) -> None:
    runs, _ = ran
    figures = {
        m.metric: m for m in cpu.cpu_figures(runs, (RATE,), SEEDS, POLICIES, TINY.duration_s)
    }
    for policy in POLICIES:
        ratios = {}
        for seed in SEEDS:
            tight = runs.real.result(policy, RATE, seed)
            roomy = runs.real.result(policy, RATE, seed, unconstrained=True)
            assert tight.policy == roomy.policy == policy
            assert tight.num_blocks == KV_BLOCKS < setups[seed].peak_blocks <= roomy.num_blocks
            ratios[seed] = tight.jct_mean_s / roomy.jct_mean_s
        own = figures[f"jct_mean_over_unconstrained[{policy}]@{RATE:g}/min_cpu"]
        assert own.value == pytest.approx(statistics.median(ratios.values()))
        assert own.note.startswith("measured")


def test_the_real_runs_rotate_the_policies_from_seed_to_seed(
    ran: tuple[CpuPanelRuns, list[str]],
) -> None:
    _, lines = ran
    order: dict[int, list[tuple[str, bool]]] = {s: [] for s in SEEDS}
    for line in lines:
        if ", real: " in line:
            policy = line.split(", real: ")[1].split(" at ")[0]
            seed = int(line.split("seed ")[1].split()[0].rstrip("."))
            order[seed].append((policy, "(unconstrained)" in line))
    first = [p for p, roomy in order[1] if not roomy]
    second = [p for p, roomy in order[2] if not roomy]
    assert first == list(POLICIES) and second == [*POLICIES[1:], POLICIES[0]]
    # Each policy's pair runs back to back, the constrained run first on one seed only.
    assert order[1][:2] == [(POLICIES[0], False), (POLICIES[0], True)]
    assert order[2][:2] == [(POLICIES[1], True), (POLICIES[1], False)]


def test_the_agreement_compares_each_workload_with_itself(
    ran: tuple[CpuPanelRuns, list[str]],
) -> None:
    runs, _ = ran
    agreement = Agreement.of(runs.real, runs.twin, POLICIES)
    for policy in POLICIES:
        errors = {}
        for seed in SEEDS:
            real = runs.real.result(policy, RATE, seed)
            twin = runs.twin.result(policy, RATE, seed)
            errors[seed] = abs(twin.jct_mean_s - real.jct_mean_s) / real.jct_mean_s
            prefill = abs(twin.counters.prefill_tokens - real.counters.prefill_tokens)
            assert agreement.errors[(policy, "prefill_tokens")][(RATE, seed)] == pytest.approx(
                prefill / real.counters.prefill_tokens
            )
        assert agreement.errors[(policy, "jct_mean")] == pytest.approx(
            {(RATE, s): e for s, e in errors.items()}
        )
        assert agreement.error(policy, "jct_mean") == pytest.approx(
            statistics.median(errors.values())
        )
    figures = {m.metric: m for m in agreement.measurements()}
    worst = figures["cpu_twin_jct_error_max"]
    assert worst.target == 0.10
    assert worst.value == pytest.approx(max(agreement.error(p, "jct_mean") for p in POLICIES))
    # A twin missing a workload the real engine ran is refused, not compared in part.
    partial = PanelRuns(runs.twin.panel, dict(runs.twin.results))
    del partial.results[Cell("kvgov", RATE, 2, False)]
    with pytest.raises(AgreementError, match=r"kvgov at .* seed 2"):
        Agreement.of(runs.real, partial, POLICIES)


def test_the_cpu_figures_say_what_ran_and_compare_kvgov_with_the_best_baseline(
    ran: tuple[CpuPanelRuns, list[str]],
) -> None:
    runs, _ = ran
    figures = {
        m.metric: m for m in cpu.cpu_figures(runs, (RATE,), SEEDS, POLICIES, TINY.duration_s)
    }
    per_seed = {p: {s: runs.real.result(p, RATE, s).jct_mean_s for s in SEEDS} for p in POLICIES}
    best = stats.best_of({p: v for p, v in per_seed.items() if p != "kvgov"}, lower_is_better=True)
    expected = stats.paired_ratio(per_seed["kvgov"], per_seed[best])
    headline = figures["jct_mean_kvgov_over_best_cpu"]
    assert headline.value == pytest.approx(expected.value) and headline.target == 1.05
    assert best in headline.note and headline.note.startswith("measured")
    assert figures["jct_mean_kvgov_over_best_cpu_lower95"].value == pytest.approx(expected.low)
    assert figures["jct_mean_kvgov_over_best_cpu_upper95"].value == pytest.approx(expected.high)
    assert "recomputed_tokens_kvgov_over_paged_cpu" in figures
    for policy in POLICIES:
        assert figures[f"jobs_failed[{policy}]_cpu"].value == 0
        assert figures[f"jct_mean[{policy}]@{RATE:g}/min_cpu"].note.startswith("measured")
        assert figures[f"jct_mean[{policy}]@{RATE:g}/min_cpu_twin"].note.startswith("modelled")
        # Where job time went is the twin's ledger alone: no zeros passed off as measured.
        assert f"jct_mean_decode[{policy}]@{RATE:g}/min_cpu" not in figures
        assert f"jct_mean_decode[{policy}]@{RATE:g}/min_cpu_twin" in figures
    assert figures["cpu_twin_jct_error_max"].target == 0.10
