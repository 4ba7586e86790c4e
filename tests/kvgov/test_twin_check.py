"""``kvgov twin check``, the short form CI runs: the twin calibrated here replays the quick
swarm workload on two policies (paged and kvgov), four twin rounds against one real
round of each.

The full check (five real rounds, the benchmark's workload, every policy) is measured
against the issue's tolerances (job time within 10%, prefill tokens within 5%; its figures
are in docs/twin.md). One real round on a shared runner varies more than that by itself (the
rounds' spread there is 10-25%), so here job time is held to 25% beyond the in-place step
error (how far the machine strayed, during the real round, from the one its grid
measured). Under kvgov (team prompts pinned, contexts held) the engine computes the same
prompt tokens whatever the timing, so its prefill is held to 5%; under the paged engine
what it computes again follows which cached blocks LRU evicts, itself the order of events
(one real round alone moves it by 5-10%), so its prefill is held to 15%.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import kvgov.twin_check
from kvgov.cli import app
from kvgov.twin_check import FIGURES, CheckOptions, TwinCheck, TwinCheckError
from tests import background

runner = CliRunner()
SHORT = CheckOptions(quick=True, rounds=1, policies=("paged", "kvgov"))


def background_child() -> background.Child:
    """The short check in a child process, run beside the suite (``tests/background.py``)."""
    return background.call("kvgov.twin_check.check_twin", SHORT)


@pytest.fixture(scope="module")
def short() -> TwinCheck:
    check = background.returned(__name__, background_child)
    assert isinstance(check, TwinCheck)
    return check


@pytest.mark.background
def test_the_twin_replays_the_real_runs_within_the_short_forms_bounds(short: TwinCheck) -> None:
    assert [c.policy for c in short.checks] == ["paged", "kvgov"]
    for check in short.checks:
        (real,) = check.real  # one real round, four twin rounds
        for twin in check.twin:
            assert twin.failed == real.failed == []
            assert twin.prompts == real.prompts  # the same program sent the same requests
        bound = 0.05 if check.policy == "kvgov" else 0.15
        assert check.error(FIGURES["prefill_tokens"]) <= bound, check.policy
        # Held to 0.25 beyond how far the machine strayed, during the real round, from the
        # one its grid measured just before (the in-place step error): one CI run read
        # the real steps 26% slower than the grid's, and the paged jobs 34% longer.
        drift = abs(check.step_error)
        assert check.error(FIGURES["jct_mean"]) <= 0.25 + drift, (check.policy, drift)
    figures = {m.metric: m for m in short.measurements()}
    assert figures["twin_jct_error_max"].target == 0.10
    assert "one before each real round" in figures["twin_jct_error_max"].note
    # The held count is the offloads (sequences moved to host), not the blocks they moved.
    counts = max(
        c.count_error(FIGURES[k]) for c in short.checks for k in ("offloads", "preemptions")
    )
    assert figures["twin_count_error_max"].value == pytest.approx(counts)
    assert figures["twin_prefill_error_max"].target == 0.05
    assert "fitted here" in figures["twin_jct_error_max"].note


@pytest.mark.background
def test_the_step_time_model_is_held_to_the_steps_the_real_rounds_took(short: TwinCheck) -> None:
    # Every real step was timed and predicted: a timer that missed the steps, or a
    # prediction at another model's shape, would be far off (the bound is loose for a
    # shared runner; the full check's figures are in docs/twin.md).
    for check in short.checks:
        assert check.measured_step_s > 0.2 * check.real[0].makespan_s, check.policy
        assert abs(check.step_error) < 0.5, (check.policy, check.step_error)
    figures = {m.metric: m for m in short.measurements()}
    worst = max(abs(c.step_error) for c in short.checks)
    assert figures["twin_step_error_max"].value == pytest.approx(worst)


@pytest.mark.background
def test_the_twins_rounds_scatter_as_the_real_steps_did(short: TwinCheck) -> None:
    # The twin's steps are scattered by the step-to-step noise measured from the real
    # steps: a shared host's is a few percent to a few tens of percent, never none.
    assert 0.005 < short.noise.sigma < 0.5, short.noise
    note = {m.metric: m for m in short.measurements()}["twin_jct_error_max"].note
    assert f"sigma {short.noise.sigma:.3f}" in note and "twin: median of 4 rounds" in note
    # Four twin rounds for each real one, each its own seed: the twin's median is of them.
    for check in short.checks:
        assert [r.round for r in check.twin] == [0, 1, 2, 3], check.policy


def test_the_step_timer_gives_the_engine_back_as_it_was() -> None:
    from engine import Engine, EngineConfig, SamplingParams
    from kvgov.twin_check import _StepTimer

    engine = Engine(EngineConfig(model="tiny-random", device="cpu", num_blocks=64))
    with _StepTimer(engine) as timer:
        engine.add_request("hello there", SamplingParams(max_tokens=3))
        while engine.has_unfinished():
            engine.step()
    assert len(timer.steps) == 3  # one prefill, two decodes
    assert [b.num_tokens for b, _ in timer.steps][1:] == [1, 1]
    assert all(seconds > 0 for _, seconds in timer.steps)
    assert "step" not in engine.__dict__ and "execute" not in engine.runner.__dict__


@pytest.mark.background
def test_the_twin_is_not_the_tools_alone(short: TwinCheck) -> None:
    # A twin that charged no compute would still wait out every tool: its jobs would be
    # the tools' latencies. The real jobs, and the twin's, spend a share on the engine.
    for check in short.checks:
        tools = sum(t.tool_s for s in _scripts() for t in s.turns if not s.planner)
        assert sum(check.twin[0].jct_s.values()) > tools


def _scripts():  # type: ignore[no-untyped-def]
    from kvgov.benchmarks.swarm.bench import QUICK, Setup

    return Setup.of(QUICK).scripts


@pytest.mark.background
def test_the_cli_prints_the_figures_as_json_lines(
    short: TwinCheck, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The module's check stands in for a second one: this checks what the CLI prints.
    monkeypatch.setattr(kvgov.twin_check, "check_twin", lambda options, progress: short)
    result = runner.invoke(app, ["twin", "check", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    rows = {json.loads(line)["metric"]: json.loads(line) for line in result.stdout.splitlines()}
    names = ("twin_jct_error_max", "twin_prefill_error_max", "jct_mean_error[kvgov]")
    for name in (*names, "offloads_error[kvgov]", "offloaded_blocks_error[kvgov]"):
        assert name in rows and rows[name]["value"] is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rounds", "0"], "at least once"),
        (["--fraction", "1.5"], "outside (0, 1]"),
        (["--policy", "lru"], "unknown policies"),
        (["--profile", "/no/such.json"], "no such file"),
    ],
)
def test_bad_options_are_one_line_and_exit_two(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["twin", "check", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    with pytest.raises(TwinCheckError):
        kvgov.twin_check._validate(CheckOptions(rounds=0))
