"""``TwinEngineLoop``: ``EngineLoop``'s contract for an engine on a twin, stepped by a task
on a virtual-time event loop (``engine.twin.event_loop``) instead of by a thread.

Everything that uses an ``EngineLoop`` (``backends.LocalBackend`` above all) takes one, so
a twin run drives the real engine through the real backend and governor. What differs is
who runs the engine and when:

- the driver is a task on the running loop: while the engine has unfinished requests it
  calls ``engine.step()`` (the twin charges the step its modelled duration and sets
  ``busy_until``), sleeps until the step's end in virtual time, then hands the outputs to
  their streams (``EngineLoop._deliver``, the engine thread's own code). A stalled step
  waits for a command or ``idle_wait_s``, as the engine thread does;
- a command (``call``, ``call_soon``, ``submit_nowait``, ``cancel``) runs at once, in
  the caller's turn on the loop, and its future is settled before it returns. On the real
  loop it would wait for the step in progress to end; the engine state it finds is the
  same (a step's state changes are made as it starts here, and it hands out its outputs
  as it ends). A caller on a worker thread (``asyncio.to_thread``: the governor's hold,
  restore and release) hears back when that step ends, as on the real loop: the command
  tells the virtual loop (``VirtualTimeLoop.reply_at``), which settles that call's future
  then. Copies it asks for start when that step ends (``TwinEngine._copy``);
- nothing blocks: ``generate`` and ``submit`` (a caller waiting for the engine's answer)
  work, since the answer is ready when ``call`` returns, but a stream's ``result()``
  before the request ends would wait forever; twin runs use the async calls.

Create it inside the coroutine ``run_virtual`` runs (it starts its driver on the running
loop); ``close()`` aborts every request, fails nothing queued (nothing ever is) and gives
the engine back for another loop.

Errors (caller input)::

    InvalidRequestError (engine.errors)
    └── TwinError (engine.twin.twin_engine)   no running event loop, or an engine with no
                                              twin attached
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from engine.engine_loop import (
    _CLAIMS,
    _CLAIMS_LOCK,
    EngineInUseError,
    EngineLoop,
    EngineLoopClosedError,
    _Command,
)
from engine.loop_snapshot import take
from engine.twin.event_loop import VirtualTimeLoop
from engine.twin.twin_engine import TwinEngine, TwinError

__all__ = ["TwinEngineLoop"]

T = TypeVar("T")


class TwinEngineLoop(EngineLoop):
    def __init__(self, twin: TwinEngine, *, idle_wait_s: float = 0.05) -> None:
        # EngineLoop.__init__ is not called: it starts the engine thread this loop replaces.
        if not twin.attached:
            raise TwinError("this twin is detached; attach_twin the engine again")
        if twin.advance:
            raise TwinError(
                "a TwinEngineLoop moves the clock itself: attach the twin with advance=False"
            )
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise TwinError(
                "a TwinEngineLoop starts its driver on the running event loop: create it "
                "inside the coroutine that run_virtual runs"
            ) from None
        engine = twin.engine
        with _CLAIMS_LOCK:
            if engine in _CLAIMS:
                raise EngineInUseError()
            _CLAIMS[engine] = self
        self.engine = engine
        self.twin = twin
        self._loop = loop
        self._lane_free_at = 0.0  # when the latest worker thread's command was answered
        self._idle_wait_s = idle_wait_s
        self._streams = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._num_steps = 0
        self._snapshot = take(engine, 0)
        self._wake = asyncio.Event()
        self._driver = loop.create_task(self._drive(), name="kvgov-twin-engine")

    # -- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        """Abort every request (returning its blocks), stop the driver and give the engine
        back. Safe to call twice."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
        self._driver.cancel()
        self._abort_all()
        self._unclaim()

    # -- calls ----------------------------------------------------------------------
    def call_soon(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` now, between the engine's steps; the future is
        settled when this returns."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed.is_set():
                raise EngineLoopClosedError()
        loop = self._loop if isinstance(self._loop, VirtualTimeLoop) else None
        sent = None if loop is None else loop.replying_at()
        _Command(fn, args, kwargs, future).run(self._publish)
        self._wake.set()  # an idle or stalled driver looks again
        if loop is not None and sent is not None:
            loop.reply_at(self._answered(sent))
        return future

    def _answered(self, sent: float) -> float:
        """When a worker thread's command sent at ``sent`` hears back: worker threads
        call the engine one at a time (the governor's backend lock), each answered
        between the engine's steps, once the step in progress (the latest one, or else
        the next, as long as the last) has ended, and on a device whose copies do not
        overlap compute, once the copies it asked for are done."""
        twin = self.twin
        sent = max(sent, self._lane_free_at)
        if twin.busy_until > sent:
            answered = twin.busy_until
        elif self.engine.has_unfinished():
            answered = sent + twin.last_step_s
        else:
            answered = sent
        if not twin.profile.copies_overlap_compute:
            answered = max(answered, twin.link.free_at)
        self._lane_free_at = answered
        return answered

    # -- the driver -----------------------------------------------------------------
    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        stalled = False
        while not self._closed.is_set():
            if not self.engine.has_unfinished():
                await self._wake.wait()
                self._wake.clear()
                continue
            if stalled:  # as the engine thread: a command may change that, or time
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._idle_wait_s)
                self._wake.clear()
                if self._closed.is_set() or not self.engine.has_unfinished():
                    continue
            if isinstance(loop, VirtualTimeLoop):
                self.twin.fold_until = loop.next_event_at()
            outputs = self._step()
            if outputs is None:
                continue
            delay = self.twin.busy_until - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            stalled = self._deliver(outputs)
