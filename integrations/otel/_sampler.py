"""Reads the backend's metrics and capacity for ``integrations.otel``, never on an event loop.

A bookkeeping call to the bundled engine (``metrics()``, ``capacity()``) waits for the
engine's current step to end, and a remote backend's is a network round trip. The
instrumentation reads them from inside the governor's events, which an async agent
publishes on its event loop's thread: read there, every model call and release would
stall every other coroutine on that loop for a step. So:

- on a thread that runs no event loop (a sync agent, a worker thread), a read happens
  at once, on that thread, as the sync call it sits in already waits for the engine;
- on an event loop's thread it is handed to the sampler's own thread (one per
  instrumentation, started with the first such read), which reads and records it there.
  Requests made while a read is pending are folded into it: there is at most one read
  in flight and one waiting, whatever the number of agents. ``capacity()`` answers
  from the last reading then, and asks for a fresh one.

``close`` stops the thread once what is pending is read; called off any event loop it
waits for that (at most ``_CLOSE_WAIT_S``), so the last figures are recorded before
``uninstrument`` returns. Its state is guarded by one condition, never held while
reading the backend or recording.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from governor import Backend, BackendCapacity, BackendMetrics

__all__ = ["BackendSampler", "on_event_loop"]

_log = logging.getLogger(__name__)
_CLOSE_WAIT_S = 5.0
T = TypeVar("T")  # what a read is recorded for: the calls that asked for it


def on_event_loop() -> bool:
    """Whether this thread runs an event loop right now."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class BackendSampler(Generic[T]):
    """Reads ``backend.metrics()`` and hands each reading to ``record(metrics, askers)``,
    with the askers (the calls whose end asked for it) it answers; see the module
    docstring for where and when."""

    def __init__(self, backend: Backend, record: Callable[[BackendMetrics, list[T]], None]) -> None:
        self._backend = backend
        self._record = record
        self._cond = threading.Condition()
        self._askers: list[T] = []
        self._pending = False  # a metrics read is asked for
        self._capacity_wanted = False
        self._busy = False  # the thread is reading or recording
        self._closed = False
        self._thread: threading.Thread | None = None
        self._capacity: BackendCapacity | None = None

    def __repr__(self) -> str:
        return f"<BackendSampler pending={self._pending} busy={self._busy}>"

    def poll(self, asker: T | None = None) -> None:
        """Read the metrics now, or on the sampler's thread (module docstring)."""
        if not on_event_loop():
            metrics = self._read_metrics()
            if metrics is not None:
                self._record(metrics, [] if asker is None else [asker])
            return
        with self._cond:
            if self._closed:
                return
            self._pending = True
            if asker is not None:
                self._askers.append(asker)
            self._wake()

    def capacity(self) -> BackendCapacity | None:
        """The backend's capacity: read now off an event loop; on one, the last reading
        (None before the first), and a fresh one is asked for."""
        if not on_event_loop():
            return self._read_capacity()
        with self._cond:
            if not self._closed:
                self._capacity_wanted = True
                self._wake()
            return self._capacity

    def close(self) -> None:
        """Stop once what is pending is read (waited for, off an event loop)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            if self._thread is None or on_event_loop():
                return
            idle = self._cond.wait_for(
                lambda: not (self._busy or self._pending or self._capacity_wanted),
                timeout=_CLOSE_WAIT_S,
            )
        if not idle:
            _log.warning("kvgov telemetry: the backend did not answer within %s s", _CLOSE_WAIT_S)

    # -- the sampler's thread -------------------------------------------------------
    def _wake(self) -> None:
        """Start the thread if it is not running, else notify it (under ``_cond``)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="kvgov-telemetry-sampler", daemon=True
            )
            self._thread.start()
        self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._capacity_wanted or self._closed)
                if not (self._pending or self._capacity_wanted):  # closed, nothing left
                    self._thread = None
                    self._cond.notify_all()
                    return
                metrics_wanted, self._pending = self._pending, False
                capacity_wanted, self._capacity_wanted = self._capacity_wanted, False
                askers, self._askers = self._askers, []
                self._busy = True
            try:
                if capacity_wanted:
                    self._read_capacity()
                metrics = self._read_metrics() if metrics_wanted else None
                if metrics is not None:
                    self._record(metrics, askers)
            except Exception:  # telemetry must never break the agents
                _log.exception("kvgov telemetry could not record the backend's metrics")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _read_metrics(self) -> BackendMetrics | None:
        try:
            return self._backend.metrics()
        except Exception:  # a closed or unreachable backend: nothing to record now
            return None

    def _read_capacity(self) -> BackendCapacity | None:
        try:
            capacity = self._backend.capacity()
        except Exception:  # a backend that cannot say: the run is traced without it
            return None
        with self._cond:
            self._capacity = capacity
        return capacity
