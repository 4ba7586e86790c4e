"""The multi-process store tests (test_processes.py, test_store_faults.py) run in a child
pytest beside the suite, on the core the serial run leaves idle (``tests/background.py``):
they spend their half minute starting agent processes and waiting out TTLs, not
computing. This module's test reads the child's outcome. To run them alone:
``KVGOV_STORE_CHILD=1 pytest tests/store/test_processes.py tests/store/test_store_faults.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests import background
from tests.redis_server import SKIP_REASON, need_redis_server

ROOT = Path(__file__).resolve().parents[2]
CHILD = "KVGOV_STORE_CHILD"  # set in the child: the modules run their tests there
MODULES = ("tests/store/test_processes.py", "tests/store/test_store_faults.py")
NUM_TESTS = 3  # the chaos run, and the store stopped with its data and emptied


def background_child() -> background.Child | None:
    if os.environ.get(CHILD) or shutil.which("redis-server") is None:
        return None
    env = {**os.environ, CHILD: "1"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *MODULES]
    return background.Child(argv, env, ROOT, timeout_s=400)


@pytest.mark.background
def test_the_multiprocess_store_tests() -> None:
    if os.environ.get(CHILD):
        pytest.skip("this is the child: its tests are the modules'")
    if shutil.which("redis-server") is None:
        need_redis_server()  # skips, or fails under CI
        pytest.skip(SKIP_REASON)
    done, _ = background.finished(__name__, background_child)
    report = done.stdout[-8000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed is not None and int(passed.group(1)) == NUM_TESTS, report
    assert "skipped" not in done.stdout, report
