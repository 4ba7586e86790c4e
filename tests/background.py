"""Child processes run as the test run goes, one at a time, on the core the serial suite
leaves idle.

pytest runs one test at a time: on the 2-core machines CI uses, one core waits. A few
tests only wait for a child process of their own: Triton's interpreter running a kernel
test file again (``triton_interpreter``), ``tests/gpu_run.sh`` in a venv like the GPU
machine's, mypy, the docs site's strict build. Started when they are reached, their
minutes add to the run; queued when collection ends, they run beside the rest of the
suite, in the order their tests were collected, one after another, so that each has the
spare core to itself (the GPU script's steps run under timeouts).

A test module offers its child with ``background_child() -> Child | None`` (``None``
where this process has no child to run, e.g. inside the interpreter's own run) and marks
the test that reads it ``@pytest.mark.background``; ``tests/conftest.py`` queues the
children of the modules whose marked tests were collected, and stops any still running
when the session ends. The test calls ``finished(__name__, background_child)``: the
child queued for it (started there and then if its turn has not come: the suite waits on
it, so the core is free), or, where none was queued (the test run alone,
``-p no:...``), the same child run there and then. Outputs go to files, not pipes, so a
child never blocks on a full pipe while nobody reads it.

Threads: the pump thread and the test thread share ``_RUNNING`` and ``_QUEUE`` under
``_LOCK``; a child is started under it, so each is started once.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Child", "call", "finished", "returned", "start", "stop_all", "summary"]


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
    by_test: bool = False  # started by its test, its turn not come
    ended: float | None = None  # when its test first saw it end
    waited_s: float = 0.0  # what its tests waited for it


_RUNNING: dict[str, _Running] = {}
_QUEUE: dict[str, Child] = {}  # in the order queued; a child leaves it as it starts
_LOGS: list[Path] = []  # the folder of the children's outputs, made at the first start
_LOCK = threading.Lock()
_PUMP: list[threading.Thread] = []
_STOPPED = threading.Event()


def start(key: str, child: Child) -> None:
    """Queue ``child`` for the module ``key`` (once); the queue runs one child at a time."""
    with _LOCK:
        if key in _RUNNING or key in _QUEUE:
            return
        _QUEUE[key] = child
        if not _PUMP:
            _STOPPED.clear()
            pump = threading.Thread(target=_pump, name="background-children", daemon=True)
            _PUMP.append(pump)
            pump.start()


def _pump() -> None:
    while not _STOPPED.is_set():
        with _LOCK:
            if not _QUEUE:
                _PUMP.clear()
                return
            key = next(iter(_QUEUE))
            running = _launch(key, _QUEUE.pop(key))
        # One past its time is left to finished(), which kills it when its test reads it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            running.process.wait(timeout=running.child.timeout_s)
            running.ended = time.monotonic()


def _launch(key: str, child: Child) -> _Running:
    """Start ``child`` now (under ``_LOCK``)."""
    if not _LOGS:
        _LOGS.append(Path(tempfile.mkdtemp(prefix="kvgov-tests-background-")))
    stdout, stderr = _LOGS[0] / f"{key}.out", _LOGS[0] / f"{key}.err"
    # One thread each, unless the child says otherwise: the suite's own torch runs two,
    # and OpenMP threads oversubscribed on 2 cores spin against each other.
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **child.env}
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [str(a) for a in child.argv], env=env, cwd=child.cwd, stdout=out, stderr=err
        )
    running = _RUNNING[key] = _Running(child, process, stdout, stderr, time.monotonic())
    return running


def finished(
    key: str, make: Callable[[], Child | None]
) -> tuple[subprocess.CompletedProcess[str], Child]:
    """The child started for ``key``, waited for; or ``make()``'s child, run now."""
    asked = time.monotonic()
    with _LOCK:
        if key in _QUEUE:  # its turn has not come: the suite waits on it, so run it now
            running = _launch(key, _QUEUE.pop(key))
            running.by_test = True
        elif key in _RUNNING:
            running = _RUNNING[key]
        else:
            child = make()
            assert child is not None, f"{key} has no child to run in this process"
            running = _launch(key, child)
    left = running.child.timeout_s - (time.monotonic() - running.began)
    try:
        running.process.wait(timeout=max(left, 1.0))
    except subprocess.TimeoutExpired:
        running.process.kill()
        running.process.wait()
    now = time.monotonic()
    running.waited_s += now - asked
    if running.ended is None:
        running.ended = now
    return (
        subprocess.CompletedProcess(
            running.process.args,
            running.process.returncode,
            running.stdout.read_text(errors="replace"),
            running.stderr.read_text(errors="replace"),
        ),
        running.child,
    )


_SUMMARY: list[str] = []  # summary() as stop_all left it (the session's end comes first)


def summary() -> list[str]:
    """A line a child: how long it ran, whether its turn had come, what the suite waited."""
    if not _RUNNING:
        return list(_SUMMARY)
    lines = []
    with _LOCK:
        for key, running in _RUNNING.items():
            ran = (running.ended or time.monotonic()) - running.began
            how = "started by its test" if running.by_test else "queued"
            lines.append(
                f"{key}: ran {ran:.0f} s, {how}, the suite waited {running.waited_s:.0f} s"
            )
    return lines


def stop_all() -> None:
    """Kill the children still running (their tests deselected or the run stopped
    early) and remove every child's scratch folders and the logs."""
    _SUMMARY[:] = summary()
    _STOPPED.set()
    with _LOCK:
        _QUEUE.clear()
        running_now = list(_RUNNING.values())
    for running in running_now:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait()
    for pump in list(_PUMP):
        pump.join()  # its child is gone: it returns at once
    _PUMP.clear()
    for running in _RUNNING.values():
        for folder in running.child.scratch:
            shutil.rmtree(folder, ignore_errors=True)
    _RUNNING.clear()
    for folder in _LOGS:
        shutil.rmtree(folder, ignore_errors=True)
    _LOGS.clear()


_CALL = """
import importlib, pickle, sys
module, _, name = sys.argv[1].rpartition(".")
with open(sys.argv[2], "rb") as f:
    args, kwargs = pickle.load(f)
value = getattr(importlib.import_module(module), name)(*args, **kwargs)
with open(sys.argv[3], "wb") as f:
    pickle.dump(value, f)
"""


def call(target: str, *args: object, timeout_s: float = 600.0, **kwargs: object) -> Child:
    """A child that calls ``target`` (``package.module.function``) with these arguments
    and pickles what it returns, for a test's fixture to read with ``returned``."""
    folder = Path(tempfile.mkdtemp(prefix="kvgov-tests-call-"))
    given, result = folder / "arguments.pickle", folder / "result.pickle"
    given.write_bytes(pickle.dumps((args, kwargs)))
    return Child(
        [sys.executable, "-c", _CALL, target, given, result],
        dict(os.environ),
        Path(__file__).resolve().parent.parent,
        timeout_s=timeout_s,
        data={"target": target, "result": result},
        scratch=(folder,),
    )


def returned(key: str, make: Callable[[], Child | None]) -> object:
    """What the ``call`` child of ``key`` returned; its output where it failed."""
    done, child = finished(key, make)
    if done.returncode != 0:
        raise AssertionError(
            f"{child.data['target']} failed in its child process (exit {done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-6000:]}"
        )
    return pickle.loads(Path(str(child.data["result"])).read_bytes())
