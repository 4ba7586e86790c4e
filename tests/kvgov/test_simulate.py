"""``kvgov plan --simulate`` and the demo's second act (``kvgov.simulate``): the swarm on
the twin of a card, three schemes, in virtual time.

The scenarios here are small (four agents, two tool calls each, short replies) so each
simulation takes a few seconds; what they check holds at any size: the same figures to
the last bit on a second run, the bytes on the host link equal to the blocks the engine
copied at the target's block size, reserve-for-max never running more requests than its
slots, the raw workload failing where its contexts outgrow the model and kvgov's not.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.twin import get_profile
from engine.twin.targets import TargetError, target_model
from kvgov.cli import app
from kvgov.simulate import Scenario, ScenarioError, Simulation, simulate

runner = CliRunner()
CARD = get_profile("rx9070xt")
QWEN = target_model("qwen3-8b", quantize="int4")
# Llama 3 8B's shape in int4, with its 8,192-token context: a raw tool output outgrows it
# within two calls here, so the small scenario shows every scheme's failure mode.
LLAMA = target_model("llama-8b-random", quantize="int4")
SMALL = Scenario(
    profile=CARD,
    target=LLAMA,
    num_agents=4,
    turns=2,
    reply_tokens=24,
    tool_scale=5.0,
    ceiling_tokens=6_000,
)


@pytest.fixture(scope="module")
def small() -> Simulation:
    return simulate(SMALL)


def _figures(simulation: Simulation) -> list[tuple[object, ...]]:
    return [dataclasses.astuple(dataclasses.replace(run, wall_s=0.0)) for run in simulation.runs]


def test_the_same_scenario_gives_the_same_figures_to_the_last_bit(small: Simulation) -> None:
    assert _figures(simulate(SMALL)) == _figures(small)


def test_each_scheme_is_what_it_says(small: Simulation) -> None:
    runs = {run.scheme: run for run in small.runs}
    assert list(runs) == ["reserve", "paged", "kvgov"]
    # Reserve-for-max: as many requests as whole contexts fit, never more.
    context_blocks = math.ceil(LLAMA.context_tokens / SMALL.block_size)
    assert runs["reserve"].num_slots == SMALL.kv_blocks // context_blocks
    assert runs["reserve"].peak_running <= runs["reserve"].num_slots
    for run in runs.values():
        assert run.peak_blocks <= SMALL.kv_blocks
        # Every byte on the link is a block the engine copied, at the target's size.
        assert run.link_bytes == run.blocks_copied * SMALL.block_bytes
        assert len(run.jct_s) + len(run.failed) == SMALL.num_agents
    # Raw tool outputs outgrow the 8k context within two calls; kvgov's reducer and
    # ceiling keep every agent inside its 6k.
    assert runs["kvgov"].failed == []
    assert any("CeilingExceeded" in why for why in runs["paged"].failed)
    assert runs["paged"].limit.startswith("context")


def test_the_figures_and_the_table_say_modelled(small: Simulation) -> None:
    figures = {m.metric: m for m in small.measurements()}
    for scheme in ("reserve", "paged", "kvgov"):
        for name in ("agents_failed", "jct_p50", "jct_p99", "peak_kv", "host_link", "makespan"):
            assert f"{name}[{scheme}]" in figures
    assert figures["agents_failed[kvgov]"].value == 0
    assert figures["simulated_wall_s"].value == small.wall_s > 0
    assert figures["simulated_wall_s"].note.startswith("modelled:")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"target": target_model("qwen3-8b")}, "leave no KV memory"),
        ({"ceiling_tokens": 9_000}, "past llama-8b-random"),
        ({"num_agents": 1}, "at least one worker"),
        ({"turns": 0}, "turns must be an int >= 1"),
    ],
)
def test_a_scenario_that_cannot_run_says_what_to_change(change: dict, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        dataclasses.replace(SMALL, **change)


def test_targets_are_read_from_published_configs_or_a_file(tmp_path: Path) -> None:
    assert QWEN.shape.kv_bytes_per_token == 36 * 8 * 128 * 2 * 2
    assert 5.5e9 < QWEN.weights_bytes < 6.5e9  # 6.95e9 projections at 4 bits, 1.24e9 at 16
    assert target_model("qwen3-8b").weights_bytes > 16e9
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    mine = target_model(str(tmp_path / "config.json"), quantize="int8")
    assert (mine.context_tokens, mine.shape.weight_bits) == (4096, 8)
    with pytest.raises(TargetError, match="name one of qwen3-8b"):
        target_model("qwen9-1t")
    with pytest.raises(TargetError, match="use int8 or int4"):
        target_model("qwen3-8b", quantize="int3")


def test_plan_simulate_prints_each_schemes_figures_as_json_lines() -> None:
    result = runner.invoke(
        app,
        [
            "plan",
            "--simulate",
            "--device",
            "rx9070xt",
            "--model",
            "qwen3-8b",
            "--quantize",
            "int4",
            "--agents",
            "4",
            "--turns",
            "1",
            "--reply-tokens",
            "16",
            "--tool-scale",
            "2",
            "--ceiling",
            "12000",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    metrics = {row["metric"]: row for row in rows}
    assert {"jct_p50[kvgov]", "peak_kv[paged]", "host_link[reserve]", "simulated_wall_s"} <= set(
        metrics
    )
    assert all(row["note"] for row in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "rx9070xt"], "needs --device"),
        (["--device", "nope", "--model", "qwen3-8b"], "no device profile named"),
        (["--device", "rx9070xt", "--model", "qwen3-8b"], "leave no KV memory"),
        (["--device", "rx9070xt", "--model", "qwen3-8b", "--preset", "qwen3.5-9b"], "--model"),
    ],
)
def test_plan_simulate_bad_input_is_one_line_and_exit_two(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["plan", "--simulate", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
