"""How many CPU threads an engine step runs on: the caller's, or one while the host is contended.

On a CPU an engine step is a few hundred small tensor operations, many of them an
OpenMP parallel region that ends in a barrier: the step waits for every thread of each
region. When another process holds one of the cores (the agents' own runtime, a tool, a
test suite), each region waits for its descheduled thread to run again. Measured on the
2-core development machine, ``kvgov bench engine``'s cold generate of 8 prompts x 64
tokens took 0.4 s on two threads when quiet; beside one busy process, 0.4-15.7 s on two
threads against 0.6-1.4 s on one. One thread is about a third slower on a quiet host, so
it cannot be the default: ``StepThreads`` measures which is faster now.

Decode steps of the same batch size do the same work, so their times compare. The
runner keeps the caller's thread count (``torch.get_num_threads()`` on the stepping
thread) and every so often runs ``probe_steps`` decode steps on the other count (one
thread, or the caller's); whichever had the lower median time for that batch size runs
the steps after. A probe that changes nothing doubles the wait before the next one (up
to ``max_interval`` decode steps); a switch starts again from ``first_interval``, so a
host that quietens down gets its threads back soon. A decode step that takes
``stall_factor`` times its batch size's fastest recent time brings the probe forward:
it starts once the count in force has had ``probe_steps`` steps since, so that the two
counts compare over the same few steps of the contention.
Prefill and mixed steps run on the count in force and are not timed.

One thread computes the same values as two here: the model's kernels split rows and
heads across threads, never a sum (``tests/engine/test_step_threads.py`` checks the
tokens). The count is set for the step and put back after it, so other torch work on
the caller's thread keeps its own.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import torch

__all__ = ["StepThreads"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class StepThreads:
    """Runs engine steps on the caller's threads or on one, whichever is faster now.

    ``run(fn, batch=n)`` for a decode step of ``n`` sequences, ``run(fn, batch=None)``
    for any other step. Not thread-safe: one engine steps on one thread at a time."""

    __slots__ = (
        "_clock",
        "_interval",
        "_narrow",
        "_probe_left",
        "_recent",
        "_until_probe",
        "first_interval",
        "max_interval",
        "narrow_steps",
        "probe_steps",
        "stall_factor",
        "steps",
    )

    def __init__(
        self,
        *,
        probe_steps: int = 3,
        first_interval: int = 16,
        max_interval: int = 512,
        stall_factor: float = 4.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.probe_steps = probe_steps
        self.first_interval = first_interval
        self.max_interval = max_interval
        self.stall_factor = stall_factor
        self._clock = clock
        self._narrow = False  # True: steps run on one thread
        self._interval = first_interval
        self._until_probe = first_interval
        self._probe_left = 0
        self.steps = 0  # steps run, and of those on one thread (probes included)
        self.narrow_steps = 0
        # (narrow, batch) -> the last decode step times at that count and batch size
        self._recent: dict[tuple[bool, int], deque[float]] = {}

    @property
    def narrow(self) -> bool:
        """Whether steps run on one thread now (the host looked contended)."""
        return self._narrow

    def run(self, fn: Callable[[], T], *, batch: int | None) -> T:
        caller = torch.get_num_threads()
        if caller <= 1:
            return fn()  # nothing to choose
        narrow = self._narrow != (batch is not None and self._probe_left > 0)
        self.steps += 1
        if narrow:
            self.narrow_steps += 1
            torch.set_num_threads(1)
        start = self._clock()
        try:
            return fn()
        finally:
            elapsed = self._clock() - start
            if narrow:
                torch.set_num_threads(caller)
            if batch is not None:
                self._record(narrow, batch, elapsed, caller)

    def _record(self, narrow: bool, batch: int, elapsed: float, caller: int) -> None:
        times = self._recent.setdefault((narrow, batch), deque(maxlen=2 * self.probe_steps))
        if self._probe_left:
            times.append(elapsed)
            self._probe_left -= 1
            if not self._probe_left:
                self._decide(batch, caller)
            return
        stalled = len(times) == times.maxlen and elapsed > self.stall_factor * min(times)
        times.append(elapsed)
        self._until_probe -= 1
        if stalled:  # time this count's steps a little longer first: one slow step is noise
            self._until_probe = min(self._until_probe, self.probe_steps - 1)
        if self._until_probe <= 0:
            self._probe_left = self.probe_steps
            self._until_probe = self._interval

    def _decide(self, batch: int, caller: int) -> None:
        """After a probe: keep the count in force, or switch to the other one."""
        probed = list(self._recent[(not self._narrow, batch)])[-self.probe_steps :]
        kept = list(self._recent.get((self._narrow, batch), ()))[-self.probe_steps :]
        if kept and statistics.median(probed) < 0.9 * statistics.median(kept):
            self._narrow = not self._narrow
            self._interval = self.first_interval
            logger.info(
                "engine steps now run on %s: decode steps of %d sequences took %.1f ms "
                "(median) on %d threads, %.1f ms on 1",
                "1 thread" if self._narrow else f"{caller} threads",
                batch,
                statistics.median(probed if not self._narrow else kept) * 1e3,
                caller,
                statistics.median(probed if self._narrow else kept) * 1e3,
            )
        else:
            self._interval = min(2 * self._interval, self.max_interval)
        self._until_probe = self._interval
