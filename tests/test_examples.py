"""Every script in examples/ runs with ``--fast`` and prints what it promises.

Each runs in a subprocess, the way a user runs it, from a temporary directory so that
the files it writes land there. ``PYTHONPATH`` is set to the repository root in case the
package is not installed; the rest of the environment is passed through. The scripts run
one after another in a child process beside the suite (``tests/background.py``), each
test reading its script's output.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from tests import background

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


# Runs each script with --fast in its own folder under sys.argv[1], keeping what it
# printed and its exit status beside it.
_RUN_ALL = """
import os, subprocess, sys
from pathlib import Path
out, examples = Path(sys.argv[1]), Path(sys.argv[2])
for script in sys.argv[3:]:
    folder = out / script
    folder.mkdir()
    done = subprocess.run(
        [sys.executable, str(examples / script), "--fast"],
        timeout=120, capture_output=True, text=True, cwd=folder,
    )
    (folder / "stdout").write_text(done.stdout)
    (folder / "stderr").write_text(done.stderr)
    (folder / "returncode").write_text(str(done.returncode))
"""


def background_child() -> background.Child:
    out = Path(tempfile.mkdtemp(prefix="kvgov-tests-examples-"))
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return background.Child(
        [sys.executable, "-c", _RUN_ALL, out, EXAMPLES, *sorted(EXPECTED)],
        {**os.environ, "PYTHONPATH": path},
        ROOT,
        timeout_s=120 * len(EXPECTED),
        data={"out": out},
        scratch=(out,),
    )


@pytest.mark.background
@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_fast(script: str) -> None:
    ran, child = background.finished(__name__, background_child)
    folder = Path(str(child.data["out"])) / script
    assert (folder / "returncode").exists(), (ran.stdout + ran.stderr)[-4_000:]
    stdout, stderr = (folder / "stdout").read_text(), (folder / "stderr").read_text()
    assert (folder / "returncode").read_text() == "0", stderr[-4_000:]
    for text in EXPECTED[script]:
        assert text in stdout, f"{text!r} not in the output of {script}:\n{stdout}"
    if script == "otel_console.py":
        assert (folder / "triage-spans.jsonl").stat().st_size > 0
