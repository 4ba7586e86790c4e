"""Without the engine extra (no torch), the CLI says what to install instead of failing
with a traceback, and what needs no engine still runs (``kvgov plan`` with sizing's own
presets). A subprocess where a meta-path finder refuses torch, as on a box that installed
plain ``kvgov``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

_RUN = r"""
import sys


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError(f"{name} is not installed here (blocked by the test)")
        return None


sys.meta_path.insert(0, Refuse())
sys.argv = ["kvgov", *sys.argv[1:]]
from kvgov.cli import app

try:
    app()
finally:
    assert "torch" not in sys.modules
"""


def _kvgov(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _RUN, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "100", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize(
    ("command", "extra"), [(("demo",), "engine"), (("serve", "--port", "0"), "serve")]
)
def test_commands_that_need_the_engine_say_what_to_install(
    command: tuple[str, ...], extra: str
) -> None:
    done = _kvgov(*command)
    assert done.returncode == 2, done.stderr
    assert f"pip install 'kvgov[{extra}]'" in done.stderr
    assert "pip install torch==2.13.0" in done.stderr
    assert "Traceback" not in done.stderr


def test_plan_runs_without_the_engine() -> None:
    done = _kvgov("plan", "--preset", "qwen3.5-9b", "--card-gb", "16", "--weights-gb", "5.5")
    assert done.returncode == 0, done.stderr
    assert "paged" in done.stdout


def test_each_extra_needs_what_pyproject_lists() -> None:
    """``requirements_of`` reads the installed metadata: pyproject's lists, an extra named
    inside another (``kvgov[engine]``) replaced by its own."""
    import re

    from kvgov.cli.extras import requirements_of

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later

    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def names(extra: str) -> list[str]:
        found: list[str] = []
        for line in listed[extra]:
            name = re.match(r"[A-Za-z0-9._-]+", line).group()  # type: ignore[union-attr]
            inner = (
                [n for e in re.findall(r"\[(.+)\]", line)[0].split(",") for n in names(e)]
                if name == "kvgov"
                else [name]
            )
            found += [n for n in inner if n not in found]
        return found

    assert requirements_of("engine") == ["torch", "safetensors", "tokenizers"]
    for extra in listed:
        assert requirements_of(extra) == names(extra), extra
