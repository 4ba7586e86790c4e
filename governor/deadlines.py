"""``Deadlines``: one daemon thread that runs callbacks when their time comes.

``SystemClock.call_later`` (``governor.clock``) runs its callbacks on it. The governor
arms a deadline at every tool call (park after ``park_after_s``, stop holding KV after
``retain_s``) and cancels most of them a few milliseconds later when the tool returns.
A ``threading.Timer`` per deadline costs a thread start each (hundreds of microseconds);
here arming is a heap push and cancelling a flag, and the one thread is started on first
use, sleeps until the earliest deadline, and ends after a minute with nothing to do (the
next deadline starts it again).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Deadline", "Deadlines"]

_IDLE_EXIT_S = 60.0


@dataclass(order=True, slots=True)
class Deadline:
    at: float
    number: int
    fn: Callable[..., None] = field(compare=False)
    args: tuple[object, ...] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class Deadlines:
    def __init__(self, *, name: str = "kvgov-deadlines") -> None:
        self._name = name
        self._heap: list[Deadline] = []
        self._numbers = itertools.count()
        self._wake = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None

    def call_later(self, seconds: float, fn: Callable[..., None], *args: object) -> Deadline:
        """Run ``fn(*args)`` on the deadline thread after ``seconds`` unless cancelled."""
        deadline = Deadline(time.monotonic() + seconds, next(self._numbers), fn, args)
        with self._wake:
            heapq.heappush(self._heap, deadline)
            if self._heap[0] is deadline:
                self._wake.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        return deadline

    def _run(self) -> None:
        while True:
            with self._wake:
                while True:
                    while self._heap and self._heap[0].cancelled:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        if not self._wake.wait(_IDLE_EXIT_S) and not self._heap:
                            self._thread = None  # the next call_later starts another
                            return
                        continue
                    delay = self._heap[0].at - time.monotonic()
                    if delay <= 0:
                        deadline = heapq.heappop(self._heap)
                        break
                    self._wake.wait(delay)
            if deadline.cancelled:
                continue
            try:
                deadline.fn(*deadline.args)
            except Exception as exc:  # the thread serves every later deadline too
                warnings.warn(
                    f"a governor deadline ({deadline.fn!r}) raised {exc!r}",
                    RuntimeWarning,
                    stacklevel=1,
                )
