"""Every script in examples/ runs with ``--fast`` and prints what it promises.

Each runs in a subprocess, the way a user runs it, from a temporary directory so that
the files it writes land there. ``PYTHONPATH`` is set to the repository root in case the
package is not installed; the rest of the environment is passed through.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# Script -> text its fast run must print.
EXPECTED = {
    "swarm.py": [
        "cannot call tools",
        "worker 1",
        "by summarizing tool output",
        "summarized 9",
        "compacted",
        "run.finished 1",
    ],
    "planner_workers_langgraph.py": [
        "guaranteed  yes      yes",
        "5 reports",
        "most workers running at once: 3 (the planner's max_fanout: 3)",
    ],
    "create_agent_middleware.py": [
        "stands in",
        "compactions so far: 1",
        "[Summary of",
        "run_tests's result, summarized",
        "kvgov_compactions",
        "kvgov_tool_tokens_saved",
    ],
    "otel_console.py": [
        '"name": "chat tiny-random"',  # ConsoleSpanExporter's JSON
        "invoke_workflow triage\n  invoke_agent triager",
        "    chat tiny-random",
        "    execute_tool pytest",
        "event kvgov.summarized",
    ],
}


def test_every_example_is_run() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_fast(script: str, tmp_path: Path) -> None:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--fast"],
        timeout=120,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4_000:]
    for text in EXPECTED[script]:
        assert text in done.stdout, f"{text!r} not in the output of {script}:\n{done.stdout}"
    if script == "otel_console.py":
        assert (tmp_path / "triage-spans.jsonl").stat().st_size > 0
