"""``ReapedBudgets``: closing the engine budgets of leases another process lost.

On a shared store (``governor.store``) the process that reaps a dead process's leases
is handed their engine budgets, once, and closes them here on a thread of its own:
never on the store's thread, an event loop or under a lock. A budget still in use (the
dead process's last request still runs in the engine: a paused process's HTTP call goes
on) is tried again, for up to ``patience_s``; one the engine does not know (the lease
was reaped between recording its budget and opening it) is done. What still fails is
counted with the other writes nobody waited for (``governor.unwaited``). Its retries are
paced in real time, as the store's heartbeats are: a store shares no virtual clock.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Collection

from governor.backend import Backend
from governor.errors import BackendError
from governor.unwaited import UnwaitedErrors

__all__ = ["ReapedBudgets"]

_UNKNOWN = "UnknownBudgetError"


class ReapedBudgets:
    def __init__(
        self, backend: Backend, unwaited: UnwaitedErrors, *, patience_s: float = 60.0
    ) -> None:
        self.backend = backend
        self.unwaited = unwaited
        self.patience_s = patience_s
        self.num_closed = 0  # budgets this process closed for others
        self._todo: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._lock = threading.Lock()  # the thread's start; a leaf
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()

    def close_later(self, budgets: Collection[str]) -> None:
        """Queue ``budgets`` to close; any thread, never waits."""
        if not budgets:
            return
        self._idle.clear()
        for name in budgets:
            self._todo.put(name)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="kvgov-reaped-budgets", daemon=True
                )
                self._thread.start()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every budget queued so far was closed or given up (tests)."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        while True:
            name = self._todo.get()
            self._close(name)
            if self._todo.empty():
                self._idle.set()

    def _close(self, name: str) -> None:
        deadline = time.monotonic() + self.patience_s
        pause = 0.1
        while True:
            try:
                self.backend.close_budget(name)
            except BackendError as exc:
                if type(exc).__name__ == _UNKNOWN or getattr(exc, "error_class", None) == _UNKNOWN:
                    return  # never opened, or closed already
                if time.monotonic() + pause > deadline:
                    self.unwaited.record(f"close_budget({name!r}) of a reaped lease", exc)
                    return
                time.sleep(pause)  # in use: its last request still runs
                pause = min(pause * 2, 2.0)
            else:
                self.num_closed += 1
                return
