"""The documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``: a broken
link or anchor, a page left out of the nav, an API name mkdocstrings cannot find, any
warning, fails it. The build takes seconds of one core, so it starts when collection ends
and runs beside the suite (``tests/background.py``)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests import background

ROOT = Path(__file__).resolve().parent.parent
NEEDS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
SKIP_REASON = (
    "the documentation site needs mkdocs, mkdocs-material and mkdocstrings[python]: "
    "pip install -e '.[docs]' (the dev extra includes it)"
)


def _missing() -> list[str]:
    return [
        name
        for name in NEEDS
        if importlib.util.find_spec(name.split(".")[0]) is None
        or importlib.util.find_spec(name) is None
    ]


def background_child() -> background.Child | None:
    """``mkdocs build --strict`` into a scratch folder; None where mkdocs is missing."""
    if _missing():
        return None
    site = Path(tempfile.mkdtemp(prefix="kvgov-docs-site-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["NO_MKDOCS_2_WARNING"] = "1"  # Material's notice about its successor, not ours
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", site]
    return background.Child(argv, env, ROOT, timeout_s=300, data={"site": site}, scratch=(site,))


@pytest.mark.background
def test_the_site_builds_strict() -> None:
    missing = _missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{SKIP_REASON}; missing: {', '.join(missing)}", pytrace=False)
        pytest.skip(SKIP_REASON)
    result, child = background.finished(__name__, background_child)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "WARNING" not in output, output[-6000:]
    site = Path(str(child.data["site"]))
    # the front page is the README, and each layer's API page lists its public names
    assert "kvgov demo" in (site / "index.html").read_text(encoding="utf-8")
    api = (site / "api" / "backends" / "index.html").read_text(encoding="utf-8")
    assert 'id="backends.LocalBackend"' in api and 'id="backends.SGLangBackend"' in api
    shutil.rmtree(site, ignore_errors=True)
