"""``kvgov plan``: the sizing calculator reproduces the design's table, and bad input is
one line on stderr with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgov.cli import app

runner = CliRunner()
DESIGN = ["plan", "--preset", "qwen3.5-9b", "--card-gb", "16", "--weights-gb", "5.5"]


def _rows(args: list[str]) -> list[dict[str, object]]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_the_design_table() -> None:
    ceiling, cap, paged = _rows(DESIGN)
    assert (ceiling["agents_admitted"], ceiling["fits"]) == (4, False)  # reserve 16k: 4 of 8
    assert round(cap["reserved_gb"], 0) == 9 and cap["fits"]  # reserve 8k: about 9 GB...
    assert round(cap["waste_at_average_pct"]) == 62  # ...63% of it wasted at 3k (62.5)
    assert paged["agents_admitted"] == 8 and paged["waste_at_average_pct"] < 1
    assert 70_000 < paged["capacity_tokens"] < 72_000  # about 71k tokens in all


def test_the_table_names_the_budget() -> None:
    result = runner.invoke(app, DESIGN, env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "= 10 GB for KV" in result.stdout and "4 of 8" in result.stdout


def test_a_config_json_and_a_kv_dtype(tmp_path: Path) -> None:
    config = {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ["plan", "--config", str(tmp_path), "--card-gb", "24", "--weights-gb", "16"]
    fp16 = _rows(args)
    fp8 = _rows([*args, "--kv-dtype", "fp8"])
    # 2 x 32 layers x 8 heads x 128 x 2 bytes = 131,072 bytes per token; fp8 halves it.
    assert fp16[2]["capacity_tokens"] == pytest.approx(7.5e9 / 131_072, rel=0.001)
    assert fp8[2]["capacity_tokens"] == pytest.approx(2 * fp16[2]["capacity_tokens"], rel=0.001)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "--preset", "gpt-9"], "unknown preset 'gpt-9'"),
        (["plan"], "exactly one of --preset NAME and --config PATH"),
        (["plan", "--config", "/no/such/model"], "cannot read"),
        ([*DESIGN[:3], "--card-gb", "4"], "nothing is left for the KV cache"),
        ([*DESIGN, "--kv-dtype", "int3"], "unknown KV dtype"),
        ([*DESIGN, "--average", "20000"], "must not exceed ceiling_tokens"),
        ([*DESIGN, "--safety", "1.5"], "safety"),
    ],
)
def test_bad_input_is_one_line_and_exit_two(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_a_malformed_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    result = runner.invoke(app, ["plan", "--config", str(tmp_path)])
    assert result.exit_code == 2 and "Error:" in result.stderr


@pytest.mark.parametrize("columns", ["80", "60"])
def test_the_table_is_whole_at_80_columns_and_piped(columns: str) -> None:
    # CliRunner's output is not a terminal: this is `kvgov plan | less` at that width.
    result = runner.invoke(app, DESIGN, env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    lines = result.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= int(columns)
    for name in ("contiguous, ceiling", "contiguous, cap", "paged", "admitted", "max_conc",
                 "on demand", "17.8 GB", "4 of 8", "71,792"):  # fmt: skip
        assert any(name in line for line in lines), name


# -- --simulate --trace: a recorded run replayed on the twin --------------------------------
TWIN = ["plan", "--simulate", "--device", "rx9070xt", "--model", "qwen3-8b", "--quantize", "int4"]


def test_plan_simulate_replays_a_recorded_trace(tmp_path: Path) -> None:
    from tests.kvgov.test_simulate_trace import SwarmRecording

    recorded = SwarmRecording(tmp_path / "run.jsonl", num_workers=1, turns=1)  # real, short
    rows = _rows([*TWIN, "--trace", str(recorded.path)])
    metrics = {row["metric"]: row for row in rows}
    for scheme in ("reserve", "paged", "kvgov"):
        assert metrics[f"agents_failed[{scheme}]"]["value"] == 0
        assert f"jct_p50[{scheme}]" in metrics and f"host_link[{scheme}]" in metrics
    note = metrics["simulated_wall_s"]["note"]
    assert note.startswith(f"modelled: the recorded trace {tmp_path / 'run.jsonl'}: 3 agents")
    assert "4 model calls, 1 tool calls" in note


def _span(operation: str, **attributes: object) -> str:
    """One span line of ``operation`` with these attributes besides its operation name."""
    span = {
        "name": operation,
        "trace_id": "0" * 32,
        "span_id": "1" * 16,
        "parent_span_id": None,
        "start_ns": 1,
        "end_ns": 2,
        "attributes": {"gen_ai.operation.name": operation, **attributes},
    }
    return json.dumps(span)


@pytest.mark.parametrize(
    ("lines", "args", "message"),
    [
        (None, [], "cannot read"),
        (["{not json"], [], "line 1: not JSON"),
        ([_span("chat")], [], "no kvgov agent span"),
        ([_span("invoke_agent", **{"kvgov.lease.id": "0"})], [], "no model call with its token"),
        ([], ["--turns", "3"], "--turns shape the swarm workload"),
    ],
)
def test_plan_simulate_a_bad_trace_is_one_line_and_exit_two(
    tmp_path: Path, lines: list[str] | None, args: list[str], message: str
) -> None:
    path = tmp_path / "run.jsonl"
    if lines is not None:
        path.write_text("".join(line + "\n" for line in lines))
    result = runner.invoke(app, [*TWIN, "--trace", str(path), *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_trace_needs_simulate() -> None:
    result = runner.invoke(app, [*DESIGN, "--trace", "run.jsonl"])
    assert result.exit_code == 2 and "add --simulate" in result.stderr
