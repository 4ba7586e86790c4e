"""The README's set-up commands, and CI running exactly the README's test command."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CI_RUN = ROOT / ".ci" / "run"
MAIN_JOB = "pip install torch==2.13.0 && pip install -e . && kvgov demo"
TEST_COMMAND = "pip install torch==2.13.0 && pip install -e '.[dev]' && python -m pytest"


def _set_up_commands() -> list[str]:
    """The fenced blocks of the README's "Set up" section, in order."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```\w*\n(.*?)```", section, re.DOTALL)]


def test_set_up_shows_the_main_job_then_the_test_command() -> None:
    assert _set_up_commands() == [MAIN_JOB, TEST_COMMAND]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    test_command = _set_up_commands()[1]
    ci_lines = [line.strip() for line in CI_RUN.read_text(encoding="utf-8").splitlines()]
    assert test_command in ci_lines


def test_ci_script_is_strict_and_executable() -> None:
    assert os.access(CI_RUN, os.X_OK)
    assert "set -euo pipefail" in CI_RUN.read_text(encoding="utf-8").splitlines()


def test_readme_python_examples_run() -> None:
    """Every ```python block of the README runs as written (on the tiny-random preset)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
