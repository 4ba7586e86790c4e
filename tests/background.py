"""Child processes started as the test run begins, on the core the serial suite leaves idle.

pytest runs one test at a time: on the 2-core machines CI uses, one core waits. A few
tests only wait for a child process of their own: Triton's interpreter running a kernel
test file again (``triton_interpreter``), ``tests/gpu_run.sh`` in a venv like the GPU
machine's. Started when they are reached, their minutes add to the run; started when
collection ends, they run beside the rest of the suite.

A test module offers its child with ``background_child() -> Child | None`` (``None``
where this process has no child to run, e.g. inside the interpreter's own run) and marks
the test that reads it ``@pytest.mark.background``; ``tests/conftest.py`` starts the
children of the modules whose marked tests were collected, and stops any still running
when the session ends. The test calls ``finished(__name__, background_child)``: the
child started for it, or, where none was (the test run alone, ``-p no:...``), the same
child run there and then. Outputs go to files, not pipes, so a child never blocks on a
full pipe while nobody reads it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Child", "finished", "start", "stop_all"]


@dataclass(frozen=True, slots=True)
class Child:
    argv: Sequence[str | os.PathLike[str]]
    env: Mapping[str, str]
    cwd: Path
    timeout_s: float = 600.0
    data: Mapping[str, object] = field(default_factory=dict)  # what the test reads after
    scratch: Sequence[Path] = ()  # folders removed when the session ends


@dataclass(slots=True)
class _Running:
    child: Child
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    began: float


_RUNNING: dict[str, _Running] = {}
_LOGS: list[Path] = []  # the folder of the children's outputs, made at the first start


def start(key: str, child: Child) -> None:
    """Start ``child`` for the module ``key`` (once)."""
    if key in _RUNNING:
        return
    if not _LOGS:
        _LOGS.append(Path(tempfile.mkdtemp(prefix="kvgov-tests-background-")))
    stdout, stderr = _LOGS[0] / f"{key}.out", _LOGS[0] / f"{key}.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [str(a) for a in child.argv], env=dict(child.env), cwd=child.cwd, stdout=out, stderr=err
        )
    _RUNNING[key] = _Running(child, process, stdout, stderr, time.monotonic())


def finished(
    key: str, make: Callable[[], Child | None]
) -> tuple[subprocess.CompletedProcess[str], Child]:
    """The child started for ``key``, waited for; or ``make()``'s child, run now."""
    if key not in _RUNNING:
        child = make()
        assert child is not None, f"{key} has no child to run in this process"
        start(key, child)
    running = _RUNNING[key]
    left = running.child.timeout_s - (time.monotonic() - running.began)
    try:
        running.process.wait(timeout=max(left, 1.0))
    except subprocess.TimeoutExpired:
        running.process.kill()
        running.process.wait()
    return (
        subprocess.CompletedProcess(
            running.process.args,
            running.process.returncode,
            running.stdout.read_text(errors="replace"),
            running.stderr.read_text(errors="replace"),
        ),
        running.child,
    )


def stop_all() -> None:
    """Kill the children still running (their tests deselected or the run stopped
    early) and remove every child's scratch folders and the logs."""
    for running in _RUNNING.values():
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait()
        for folder in running.child.scratch:
            shutil.rmtree(folder, ignore_errors=True)
    _RUNNING.clear()
    for folder in _LOGS:
        shutil.rmtree(folder, ignore_errors=True)
    _LOGS.clear()
