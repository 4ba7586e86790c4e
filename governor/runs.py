"""Runs: one workflow invocation (a graph's ``invoke``), the root that leases belong to.

``with governor.run("triage"):`` (or ``async with``) marks everything requested inside it,
on this thread or task and in the threads and tasks it starts with a copy of its
context, as part of one run: each lease and event carries the run's id, and tracing
draws an ``invoke_workflow`` span around them. Runs nest: an inner run's leases belong to
the inner run. The current run lives in a ``contextvars.ContextVar``, as OpenTelemetry's
current span does.
"""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import Callable
from types import TracebackType

from governor.clock import SYSTEM_CLOCK, Clock
from governor.events import error_name

__all__ = ["Run", "current_run_id"]

_CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvgov_run_id", default=None)
_IDS = itertools.count(1)


def current_run_id() -> str | None:
    """The id of the run this code runs in, if any."""
    return _CURRENT.get()


class Run:
    """A context manager for ``with`` and ``async with``; ``run_id`` is set on entry.
    ``clock`` times it (``run.finished``'s ``elapsed_s``): the governor's."""

    __slots__ = ("_clock", "_publish", "_started", "_token", "name", "parent_id", "run_id")

    def __init__(
        self, name: str, publish: Callable[..., None], *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.name = name
        self.run_id: str | None = None
        self.parent_id: str | None = None
        self._publish = publish
        self._clock = clock
        self._token: contextvars.Token[str | None] | None = None
        self._started = 0.0

    def __repr__(self) -> str:
        return f"<Run {self.name!r} id={self.run_id}>"

    def __enter__(self) -> Run:
        self.parent_id = _CURRENT.get()
        self.run_id = f"run-{next(_IDS)}"
        self._token = _CURRENT.set(self.run_id)
        self._started = self._clock.now()
        self._publish("run.started", self, name=self.name, parent_run_id=self.parent_id)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._token is not None, "a run is entered before it is exited"
        self._publish(
            "run.finished",
            self,
            name=self.name,
            elapsed_s=self._clock.now() - self._started,
            error=error_name(exc),
        )
        _CURRENT.reset(self._token)

    async def __aenter__(self) -> Run:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)
