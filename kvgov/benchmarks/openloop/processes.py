"""Runs of the open-loop benchmark in parallel processes: a pool of spawned interpreters,
torch on one thread in each, results handed back as they finish.

Every run of the benchmark is in virtual time and decided by the engine, the policies and
the workload alone, so a run's figures do not depend on which process runs it or when
(``tests/kvgov/test_openloop_panel.py`` holds the panel's equal to one process's): the
processes change the wall time, nothing else. The pool spawns rather than forks: a forked
child of a process that has run torch may hang on a lock a thread held at the fork.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TypeVar

__all__ = ["default_processes", "in_processes"]

T = TypeVar("T")


def default_processes() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def in_processes(
    jobs: Sequence[Callable[[], T]],
    *,
    processes: int,
    done: Callable[[int, T], None] = lambda index, result: None,
) -> list[T]:
    """Each job (a picklable call: a module-level function, or a ``functools.partial``
    of one) in a pool of at most ``processes`` spawned processes, in the order given
    (put the longest first, so that none is left alone at the end); ``done(index,
    result)`` as each finishes. With one process, or one job, they run here, one after
    another: a pool would only add a spawn. The results, in the jobs' order."""
    if processes < 1:
        raise ValueError(f"processes must be at least 1, got {processes}")
    if processes == 1 or len(jobs) <= 1:
        here = []
        for index, job in enumerate(jobs):
            here.append(job())
            done(index, here[-1])
        return here
    results: dict[int, T] = {}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=min(processes, len(jobs)) or 1, mp_context=context, initializer=_one_thread
    ) as pool:
        pending = {pool.submit(job): index for index, job in enumerate(jobs)}
        for future in as_completed(pending):
            index = pending[future]
            results[index] = future.result()
            done(index, results[index])
    return [results[index] for index in range(len(jobs))]


def _one_thread() -> None:
    """A pool process computes on one thread: the processes are the parallelism, and
    torch's threads on top of them would only contend for the same cores."""
    import torch

    torch.set_num_threads(1)
