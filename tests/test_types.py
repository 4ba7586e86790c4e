"""The type check: mypy over the packages and at the strictness ``[tool.mypy]`` in
``pyproject.toml`` sets (CONTRIBUTING says how to run it by hand).

mypy takes about a minute of one core, so it runs as a child started when collection ends
(``tests/background.py``), beside the rest of the suite, with its cache in a folder of its
own. Without mypy installed the test skips, saying how to install it, except under CI
(``CI`` set), where it fails: a CI run that skipped it would pass having checked no types.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

from tests import background

ROOT = Path(__file__).resolve().parent.parent
SKIP_REASON = (
    "mypy is not installed: pip install -e '.[dev]' (or pip install mypy) to run the type check"
)
CI_REASON = "; CI must run it (.ci/run installs the dev extra, which lists mypy)"


def _have_mypy() -> bool:
    return importlib.util.find_spec("mypy") is not None


def background_child() -> background.Child | None:
    """``python -m mypy`` in the repository root (its settings from pyproject.toml), with a
    fresh cache that is removed when the session ends; None without mypy."""
    if not _have_mypy():
        return None
    cache = Path(tempfile.mkdtemp(prefix="kvgov-mypy-cache-"))
    return background.Child(
        argv=[sys.executable, "-m", "mypy", "--cache-dir", cache],
        env=dict(os.environ),
        cwd=ROOT,
        timeout_s=600.0,
        scratch=[cache],
    )


@pytest.mark.background
def test_mypy_finds_no_errors() -> None:
    if not _have_mypy():
        if os.environ.get("CI"):
            pytest.fail(SKIP_REASON + CI_REASON, pytrace=False)
        pytest.skip(SKIP_REASON)
    result, _ = background.finished(__name__, background_child)
    assert result.returncode == 0, f"mypy reports errors:\n{result.stdout}{result.stderr}"
    assert "Success: no issues found" in result.stdout, result.stdout
