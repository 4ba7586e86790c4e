"""``ReapedBudgets``: closing the engine budgets of leases another process lost.

On a shared store (``governor.store``) the process that reaps a dead process's leases
is handed their engine budgets, once, and closes them here on a thread of its own:
never on the store's thread, an event loop or under a lock. A budget still in use (the
dead process's last request still runs in the engine: a paused process's HTTP call goes
on) is tried again, for up to ``patience_s``; one the engine does not know (the lease
was reaped between recording its budget and opening it) is done. Each one done is
told back (``on_closed``): the store keeps a reaped lease's room counted until then, so
no lease is admitted into blocks an engine budget still holds. What still fails is
counted with the other writes nobody waited for (``governor.unwaited``). Its retries are
paced in real time, as the store's heartbeats are: a store shares no virtual clock.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Collection

from governor.backend import Backend
from governor.errors import BackendError
from governor.unwaited import UnwaitedErrors

__all__ = ["ReapedBudgets"]

_log = logging.getLogger(__name__)

_UNKNOWN = "UnknownBudgetError"


class ReapedBudgets:
    def __init__(
        self,
        backend: Backend,
        unwaited: UnwaitedErrors,
        *,
        on_closed: Callable[[str], None] = lambda name: None,
        patience_s: float = 60.0,
    ) -> None:
        self.backend = backend
        self.on_closed = on_closed
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
        """Rounds over every budget not closed yet, so one still in use delays no other;
        a budget is tried again after a pause that doubles up to half a second."""
        pending: dict[str, tuple[float, float, float]] = {}  # name -> (next try, pause, deadline)
        while True:
            now = time.monotonic()
            wait = None if not pending else max(0.0, min(t for t, _, _ in pending.values()) - now)
            try:
                name = self._todo.get(timeout=wait)
                pending.setdefault(name, (0.0, 0.05, time.monotonic() + self.patience_s))
                continue  # take every name queued before trying any
            except queue.Empty:
                pass
            now = time.monotonic()
            for name, (at, pause, deadline) in list(pending.items()):
                if at > now:
                    continue
                done = self._try(name, last=now + pause > deadline)
                if done is None:
                    pending[name] = (now + pause, min(pause * 2, 0.5), deadline)
                    continue
                del pending[name]
                if done:
                    try:
                        self.on_closed(name)
                    except Exception as exc:  # the store's deadline returns the room then
                        self.unwaited.record(f"telling the store {name!r} closed", exc)
            if not pending and self._todo.empty():
                self._idle.set()

    def _try(self, name: str, *, last: bool) -> bool | None:
        """Closed, or the engine does not know it (True); still in use (None, unless
        ``last``); given up (False)."""
        try:
            self.backend.close_budget(name)
        except BackendError as exc:
            _log.debug("close_budget(%r) of a reaped lease: %s: %s", name, type(exc).__name__, exc)
            if type(exc).__name__ == _UNKNOWN or getattr(exc, "error_class", None) == _UNKNOWN:
                return True  # never opened, or closed already
            if last:
                self.unwaited.record(f"close_budget({name!r}) of a reaped lease", exc)
                return False
            return None  # in use: its last request still runs
        self.num_closed += 1
        return True
