"""``kvgov bench swarm`` on a tiny workload: the invariants a wrong figure would break.

The four policies run once, side by side, at the generous budget (every agent's peak
context fits at once, so nothing is evicted and the recomputed tokens can be derived
exactly from the prompts); the figures' arithmetic is checked on results built here.
"""

from __future__ import annotations

import math
import sys

import pytest

from engine.presets import PRESETS
from engine.tokenizer import load_tokenizer
from governor import TokenCounter
from kvgov.benchmarks.swarm.bench import POLICIES, compare, measurements
from kvgov.benchmarks.swarm.result import EngineCounters, RunResult
from kvgov.benchmarks.swarm.workload import SwarmWorkload, build_scripts, peak_blocks

TINY = SwarmWorkload(num_teams=1, workers_per_team=2, turns=2, tool_output_tokens=96,
                     system_repeats=1, tool_scale=0.1)  # fmt: skip


@pytest.fixture(scope="module")
def results() -> list[RunResult]:
    return compare(TINY, fractions=(1.0,), deadline_s=120.0)


@pytest.fixture(scope="module")
def prompts() -> dict[str, list[int]]:
    tokenizer = load_tokenizer(PRESETS["tiny-random"].tokenizer)
    scripts = build_scripts(TINY, TokenCounter(tokenizer=tokenizer))
    return {f"{s.name}/{i}": tokenizer.encode_chat(list(t.messages))
            for s in scripts for i, t in enumerate(s.turns)}  # fmt: skip


def test_every_policy_sends_the_same_prompts_and_finishes_every_job(
    results: list[RunResult], prompts: dict[str, list[int]]
) -> None:
    assert [r.policy for r in results] == list(POLICIES)
    for result in results:
        assert set(result.prompts) == set(prompts)  # every agent's every turn, once
        assert result.prompts == results[0].prompts, result.policy
        assert result.failed == []
        assert set(result.jct_s) == {key.split("/")[0] for key in prompts}


def test_the_budget_is_every_peak_at_once_and_never_exceeded(
    results: list[RunResult],
) -> None:
    tokenizer = load_tokenizer(PRESETS["tiny-random"].tokenizer)
    counter = TokenCounter(tokenizer=tokenizer)
    scripts = build_scripts(TINY, counter)
    full = peak_blocks(scripts, counter, reply_tokens=TINY.reply_tokens, block_size=16)
    largest = max(peak_blocks([s], counter, reply_tokens=TINY.reply_tokens, block_size=16)
                  for s in scripts)  # fmt: skip
    for result in results:
        assert result.num_blocks == max(full, 2 * largest)
        # Host swap space for every peak at once: no policy that swaps ever finds it full.
        assert result.host_blocks == full
        assert 0 < result.peak_blocks <= result.num_blocks
        assert max(b for _, b in result.timeline) == result.peak_blocks


def test_paged_recomputes_only_the_tails_of_blocks_when_nothing_is_evicted(
    results: list[RunResult], prompts: dict[str, list[int]]
) -> None:
    # Each next call repeats its previous prompt; the prefix cache holds the full blocks
    # of it, so the engine computes again only the previous prompt's last partial block
    # (the previous output is not in the next prompt: the script's turn is).
    expected = 0
    for key, prompt in prompts.items():
        agent, turn = key.split("/")
        if int(turn) == 0:
            continue
        previous = prompts[f"{agent}/{int(turn) - 1}"]
        shared = next((i for i, (a, b) in enumerate(zip(prompt, previous, strict=False))
                       if a != b), min(len(prompt), len(previous)))  # fmt: skip
        expected += shared - shared // 16 * 16
    paged = results[0]
    assert paged.counters.recomputed_tokens == expected
    # The prompt tokens the engine computed, the recomputed tails among them: never more
    # than the prompts hold (nothing was preempted), and the share is of those.
    assert expected < paged.counters.prefill_tokens <= sum(len(p) for p in prompts.values())
    assert paged.recomputed_share == 100 * expected / paged.counters.prefill_tokens
    assert paged.counters.preemptions == 0
    assert paged.counters.blocks_swapped_out == paged.counters.blocks_swapped_in == 0


def test_the_headline_ratios_compare_the_runs_they_name() -> None:
    def run(policy: str, jct: float, recomputed: int) -> RunResult:
        result = RunResult(policy, 0.33, 100, 32_768, jct_s={"a": jct, "b": jct})
        result.counters = EngineCounters(10_000, recomputed, 0, 0, 0)
        return result

    runs = [run("paged", 9.0, 4_000), run("ttl-pin", 6.0, 1_000),
            run("intercept", 4.5, 800), run("kvgov", 3.0, 500)]  # fmt: skip
    figures = {m.metric: m for m in measurements(runs, TINY)}
    assert figures["jct_mean_paged_over_kvgov"].value == 3.0
    assert figures["jct_mean_best_research_over_kvgov"].value == 1.5  # intercept's 4.5 s
    assert figures["recomputed_tokens_kvgov_over_paged"].value == 0.125
    assert figures["prefill_tokens[paged@0.33]"].value == 10_000
    assert figures["recomputed_share[paged@0.33]"].value == 40.0  # 4,000 of 10,000
    assert figures["recomputed_share[kvgov@0.33]"].value == 5.0
    assert figures["jobs_failed[kvgov@0.33]"].target == 0.0
    assert math.isnan(figures["jct_mean[paged@0.33]"].value) is False
    assert "jct_mean_kvgov_over_unconstrained" not in figures  # no run at 1.0 to compare


def test_the_headline_budget_is_compared_with_the_engine_that_had_room_for_every_peak() -> None:
    """Both policies' distance from paged at 1.0 (the unconstrained engine) bounds the
    headline ratio between them: it is the one over the other."""

    def run(policy: str, fraction: float, jct: float) -> RunResult:
        result = RunResult(policy, fraction, 100, 32_768, jct_s={"a": jct})
        result.counters = EngineCounters(10_000, 100, 0, 0, 0)
        return result

    runs = [run("paged", 1.0, 2.0), run("kvgov", 1.0, 2.2), run("intercept", 1.0, 1.9),
            run("paged", 0.33, 9.0), run("ttl-pin", 0.33, 6.0), run("intercept", 0.33, 4.5),
            run("kvgov", 0.33, 3.0)]  # fmt: skip
    figures = {m.metric: m for m in measurements(runs, TINY)}
    kvgov = figures["jct_mean_kvgov_over_unconstrained"]
    research = figures["jct_mean_best_research_over_unconstrained"]
    paged = figures["jct_mean_paged_over_unconstrained"]
    assert (paged.value, research.value, kvgov.value) == (4.5, 2.25, 1.5)  # over 2.0 s, not 1.9
    assert "intercept at 0.33 4.50 s over paged at 1.0 2.00 s" in research.note
    assert figures["jct_mean_best_research_over_kvgov"].value == research.value / kvgov.value
    assert figures["jct_mean_paged_over_kvgov"].value == paged.value / kvgov.value
    assert kvgov.target is None and research.target is None and paged.target is None


def test_the_plots_are_written_with_their_note_inside_the_figure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--plot writes both figures; the note under the budget plot (what ran) is wrapped to
    the figure's width and clear of the axes, not cut at the right edge."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from kvgov.benchmarks.swarm.plot import footnote, plot

    # Wide letters: a fixed number of characters a line would run past the right edge.
    note = "MWMW WWM MMWW WMW MWWM, " * 20
    fig, ax = plt.subplots(figsize=(7, 4.2))
    try:
        bottom = footnote(fig, note)
        fig.tight_layout(rect=(0, bottom, 1, 1))
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        text = fig.texts[0].get_window_extent(renderer)
        assert text.x0 >= 0 and text.x1 <= fig.bbox.x1 and text.y0 >= 0  # inside the figure
        assert text.y1 <= ax.get_tightbbox(renderer).y0  # below the axes and their labels
    finally:
        plt.close(fig)

    def run(policy: str, fraction: float, jct: float) -> RunResult:
        num_blocks = round(300 * fraction)
        result = RunResult(policy, fraction, num_blocks, 32_768, jct_s={"a": jct}, makespan_s=2.0)
        for t, blocks in ((0.0, 0), (0.5, 60), (1.0, 90), (2.0, 0)):
            result.sample(t, blocks)
        return result

    runs = [run(p, f, 3.0 + f) for p in POLICIES for f in (1.0, 0.33)]
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text kept as text, to read
        written = plot(runs, tmp_path, fraction=0.33, note=note)
    names = sorted(path.name for path in written)
    assert names == ["swarm-blocks.png", "swarm-blocks.svg", "swarm-jct.png", "swarm-jct.svg"]
    assert all(path.stat().st_size > 1_000 for path in written)
    # Each budget's ticks give its blocks, since a floor can make two fractions one budget.
    svg = (tmp_path / "swarm-jct.svg").read_text()
    assert "300 blocks" in svg and "99 blocks" in svg


def test_the_headline_notes_give_each_rounds_ratio_behind_the_median() -> None:
    def run(policy: str, jct: float, round_: int) -> RunResult:
        result = RunResult(policy, 0.33, 100, 32_768, jct_s={"a": jct})
        result.counters = EngineCounters(10_000, 100, 0, 0, 0)
        result.round = round_
        return result

    runs = [run(p, jct, r) for r, (paged, kvgov) in enumerate([(6.0, 3.0), (4.0, 4.0),
                                                                (5.0, 4.0)])
            for p, jct in (("paged", paged), ("ttl-pin", 5.0), ("intercept", 6.0),
                           ("kvgov", kvgov))]  # fmt: skip
    figures = {m.metric: m for m in measurements(runs, TINY)}
    paged = figures["jct_mean_paged_over_kvgov"]
    assert paged.value == 1.25 and "3 rounds (each: 2.00, 1.00, 1.25)" in paged.note
    research = figures["jct_mean_best_research_over_kvgov"]
    assert research.value == 1.25 and "(each: 1.67, 1.25, 1.25)" in research.note


def test_kvgov_bench_passes_model_and_device_to_the_benchmarks_that_take_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI's routing of --model (fake benchmark modules: the real swarm runs for
    minutes); the real swarm's run takes both options."""
    from inspect import signature
    from types import ModuleType

    from typer.testing import CliRunner

    from engine.benchmarks import Measurement
    from kvgov import cli
    from kvgov.benchmarks.swarm import bench as swarm

    assert {"device", "model"} <= set(signature(swarm.run).parameters)
    seen: list[str] = []

    def takes_model(*, quick: bool = False, model: str = "tiny-random"):  # type: ignore[no-untyped-def]
        seen.append(model)
        yield Measurement("modelled", "s", 1.0, "s")

    def takes_none(*, quick: bool = False):  # type: ignore[no-untyped-def]
        yield Measurement("plain", "s", 1.0, "s")

    for name, fn in (("modelled", takes_model), ("plain", takes_none)):
        module = ModuleType(name)
        module.run = fn  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(cli.benchmarks, "BENCHMARKS", {"modelled": "modelled", "plain": "plain"})
    runner = CliRunner()
    result = runner.invoke(cli.app, ["bench", "modelled", "--model", "llama-8b-random", "--json"])
    assert result.exit_code == 0, result.output
    assert seen == ["llama-8b-random"]
    result = runner.invoke(cli.app, ["bench", "plain", "--model", "tiny-random"])
    assert result.exit_code == 2
    assert result.stderr == "Error: kvgov bench plain takes no --model: it runs its own model.\n"
    result = runner.invoke(cli.app, ["bench", "modelled", "--model", "no-such-model"])
    assert result.exit_code == 2 and "neither a preset" in result.stderr
    assert seen == ["llama-8b-random"]  # refused before anything ran
    result = runner.invoke(cli.app, ["bench", "all", "--model", "tiny-random", "--json"])
    assert result.exit_code == 0, result.output
    assert '"modelled"' in result.stdout and '"plain"' not in result.stdout


def test_a_local_model_folder_runs_with_its_own_tokenizer(tmp_path, results) -> None:  # type: ignore[no-untyped-def]
    """``--model PATH``: the prompts are built with the folder's tokenizer (here the
    tiny-random preset written out, so they must be the preset's, token for token)."""
    from engine.hf_export import export_preset

    folder = export_preset(tmp_path / "tiny")
    (paged,) = compare(TINY, fractions=(1.0,), policies=("paged",), model=str(folder),
                       deadline_s=120.0)  # fmt: skip
    assert paged.failed == [] and paged.prompts == results[0].prompts
    assert paged.host_blocks == results[0].host_blocks
