"""One thread owns the engine; any thread or event loop may submit to it.

``EngineLoop`` runs a single-threaded ``Engine`` on one thread: commands (requests, aborts,
budget and prefix calls) run there in arrival order, between steps, and results come back
through per-request sinks. A consumer that stops listening aborts its request; an abort
is queued behind its request, so it always finds it. After ``close`` nothing is queued,
queued commands fail with ``EngineLoopClosedError`` and every request is aborted. One loop
per engine (``EngineInUseError``). ``snapshot()`` reads the latest ``LoopSnapshot`` without
a round trip.

The loop's design: docs/design/engine-step.md; its locks: docs/design/lock-order.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.engine import Engine
from engine.errors import EngineError
from engine.loop_snapshot import LoopSnapshot, take
from engine.outputs import Completion, RequestOutput
from engine.sampling import SamplingParams

__all__ = [
    "STREAM_END",
    "EngineInUseError",
    "EngineLoop",
    "EngineLoopClosedError",
    "RequestStream",
    "Submission",
    "settle",
]

T = TypeVar("T")
STREAM_END = object()  # what a sink receives after the last output


class EngineLoopClosedError(EngineError):
    def __init__(self) -> None:
        super().__init__("the engine loop is closed; start a new EngineLoop")


class EngineInUseError(EngineError):
    def __init__(self) -> None:
        super().__init__(
            "another EngineLoop already drives this engine, and one thread steps an engine: "
            "close that loop (or the LocalBackend around it) first, or share it "
            "(LocalBackend(loop) takes a running loop)"
        )


# The loop that drives each engine: claimed as a loop starts, given back as its thread ends.
_CLAIMS: weakref.WeakKeyDictionary[Engine, EngineLoop] = weakref.WeakKeyDictionary()
_CLAIMS_LOCK = threading.Lock()


@dataclass(slots=True, eq=False)
class _Command:
    """A call to run on the engine thread, and where its answer goes."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    future: Future[Any]

    def run(self, before_answer: Callable[[], None] = lambda: None) -> None:
        if self.future.set_running_or_notify_cancel():
            try:
                result = self.fn(*self.args, **self.kwargs)
            except BaseException as exc:  # handed to the caller, who re-raises it
                before_answer()
                self.future.set_exception(exc)
            else:
                before_answer()
                self.future.set_result(result)

    def fail(self, error: BaseException) -> None:
        if self.future.set_running_or_notify_cancel():
            self.future.set_exception(error)


def _nothing() -> None:
    return None


def settle(future: asyncio.Future[object], item: object) -> None:
    """Set ``future``'s result from a callback the engine thread scheduled
    (``loop.call_soon_threadsafe``); a cancelled caller's future stays cancelled."""
    if not future.done():
        future.set_result(item)


class RequestStream:
    """Outputs of one request as they are produced, then its completion."""

    def __init__(self, request_id: str, sink: Callable[[object], None] | None = None) -> None:
        self.request_id = request_id
        self._items: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._sink = sink or self._items.put
        self._completion: Future[Completion] = Future()

    def _push(self, item: RequestOutput) -> None:
        self._sink(item)

    def _finish(self, completion: Completion) -> None:
        self._completion.set_result(completion)
        self._end(STREAM_END)

    def _fail(self, error: BaseException) -> None:
        self._completion.set_exception(error)
        self._end(error)

    def _end(self, last: object) -> None:
        # Runs on the engine thread: a consumer's broken sink must not end that thread.
        with contextlib.suppress(Exception):
            self._sink(last)

    def __iter__(self) -> Iterator[RequestOutput]:
        while True:
            item = self._items.get()
            if item is STREAM_END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, RequestOutput)  # a sink hears outputs, then the end
            yield item

    def result(self, timeout: float | None = None) -> Completion:
        return self._completion.result(timeout)


@dataclass(slots=True, eq=False)
class Submission:
    """A request queued by ``EngineLoop.submit_nowait``. ``stream`` is set on the engine
    thread when the request is added, before its sink receives anything; it stays
    ``None`` when the request was refused (the sink then received the error)."""

    stream: RequestStream | None = None


class EngineLoop:
    def __init__(self, engine: Engine, *, idle_wait_s: float = 0.05) -> None:
        with _CLAIMS_LOCK:
            if engine in _CLAIMS:
                raise EngineInUseError()
            _CLAIMS[engine] = self
        self.engine = engine
        self._idle_wait_s = idle_wait_s
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Lock()  # the closed mark against queueing a command
        self._closed = threading.Event()
        self._num_steps = 0
        self._thread = threading.Thread(target=self._run, name="kvgov-engine", daemon=True)
        try:
            # Taken here, before the thread starts: until then this thread owns the engine.
            self._snapshot = take(engine, 0)
            self._thread.start()
        except BaseException:
            self._unclaim()
            raise

    # -- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        """Abort every request (returning its blocks), fail every command still queued
        with ``EngineLoopClosedError``, and stop the thread."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            self._commands.put(_Command(_nothing, (), {}, Future()))  # wake the thread
        if threading.current_thread() is not self._thread:  # from a sink: it stops after
            self._thread.join()

    def __enter__(self) -> EngineLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls from any thread ------------------------------------------------------
    def snapshot(self) -> LoopSnapshot:
        """The engine's metrics and capacity as of the last step or command, without
        waiting for the step in progress (``engine.loop_snapshot``)."""
        return self._snapshot

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the engine thread and return its result."""
        return self.call_soon(fn, *args, **kwargs).result()

    def call_soon(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(*args, **kwargs)`` for the engine thread; its future fails with
        ``EngineLoopClosedError`` if the loop closes before it runs."""
        future: Future[T] = Future()
        command = _Command(fn, args, kwargs, future)
        with self._lock:
            if self._closed.is_set():
                raise EngineLoopClosedError()
            self._commands.put(command)
        return future

    def submit(
        self,
        prompt: str | Sequence[int],
        sampling: SamplingParams | None = None,
        *,
        sink: Callable[[object], None] | None = None,
        **options: Any,
    ) -> RequestStream:
        """Queue a request; bad input raises here, in the caller's thread. ``sink``, when
        given, receives each output on the engine thread (it must not block), then the
        end marker ``STREAM_END`` or the exception that ended the request."""
        return self.call(self._add, prompt, sampling, sink, options)

    def submit_nowait(
        self,
        prompt: str | Sequence[int] | Callable[[], str | Sequence[int]],
        sampling: SamplingParams | None = None,
        *,
        sink: Callable[[object], None],
        **options: Any,
    ) -> Submission:
        """Queue a request without waiting for the engine thread (an event loop's call).

        ``sink`` receives, on the engine thread, each output, then ``STREAM_END`` or the
        exception that ended the request, or, when the request is refused (bad input, a
        closed loop), only that exception. A callable ``prompt`` runs on the engine thread
        first; keep it short (it delays the next step). Raises ``EngineLoopClosedError``
        here when the loop is already closed.
        """
        submission = Submission()
        future = self.call_soon(self._add_submission, submission, prompt, sampling, sink, options)

        def refused(done: Future[Any]) -> None:
            # Runs where the future is settled: the engine thread, or close()'s caller.
            error = done.exception()
            if error is not None:
                with contextlib.suppress(Exception):  # a broken sink must not end that thread
                    sink(error)

        future.add_done_callback(refused)
        return submission

    def cancel(self, submission: Submission) -> Future[None] | None:
        """Abort a request queued by ``submit_nowait``, whether or not the engine thread
        has added it yet (the abort runs after the add, on the same queue); a no-op once
        the request ended or the loop closed. The future settles once it has run, None
        when closed."""
        with contextlib.suppress(EngineLoopClosedError):
            return self.call_soon(self._cancel, submission)
        return None

    def _add_submission(
        self,
        submission: Submission,
        prompt: str | Sequence[int] | Callable[[], str | Sequence[int]],
        sampling: SamplingParams | None,
        sink: Callable[[object], None],
        options: dict[str, Any],
    ) -> None:
        if callable(prompt):
            prompt = prompt()
        submission.stream = self._add(prompt, sampling, sink, options)

    def _cancel(self, submission: Submission) -> None:
        if submission.stream is not None:
            self._abort(submission.stream.request_id)

    def _add(
        self,
        prompt: str | Sequence[int],
        sampling: SamplingParams | None,
        sink: Callable[[object], None] | None,
        options: dict[str, Any],
    ) -> RequestStream:
        request_id = self.engine.add_request(prompt, sampling, **options)
        stream = self._streams[request_id] = RequestStream(request_id, sink)
        return stream

    def generate(
        self, prompt: str | Sequence[int], sampling: SamplingParams | None = None, **options: Any
    ) -> Completion:
        return self.submit(prompt, sampling, **options).result()

    def abort(self, request_id: str) -> Future[None] | None:
        """Abort a request (a no-op once closed: closing aborted every request); the
        future settles once it is done, None when closed."""
        with contextlib.suppress(EngineLoopClosedError):
            return self.call_soon(self._abort, request_id)
        return None

    # -- calls from coroutines ------------------------------------------------------
    async def astream(
        self, prompt: str | Sequence[int], sampling: SamplingParams | None = None, **options: Any
    ) -> AsyncIterator[RequestOutput]:
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[object] = asyncio.Queue()

        def sink(item: object) -> None:
            # Runs on the engine thread, which must outlive a consumer whose event loop
            # closed before its abort arrived.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(items.put_nowait, item)

        submission = self.submit_nowait(prompt, sampling, sink=sink, **options)
        finished = False
        try:
            while True:
                item = await items.get()
                if item is STREAM_END:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                assert isinstance(item, RequestOutput)  # a sink hears outputs, then the end
                yield item
        finally:
            if not finished:  # the consumer went away: free its blocks now
                self.cancel(submission)

    async def agenerate(
        self, prompt: str | Sequence[int], sampling: SamplingParams | None = None, **options: Any
    ) -> Completion:
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[object] = loop.create_future()

        def sink(item: object) -> None:
            if item is STREAM_END or isinstance(item, BaseException):
                with contextlib.suppress(RuntimeError):  # as astream's: the loop may be gone
                    loop.call_soon_threadsafe(settle, ended, item)

        submission = self.submit_nowait(prompt, sampling, sink=sink, **options)
        try:
            item = await ended
        except asyncio.CancelledError:
            self.cancel(submission)
            raise
        if isinstance(item, BaseException):
            raise item
        assert submission.stream is not None  # set before the sink heard of the request
        return submission.stream.result()

    # -- the engine thread ----------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        finally:  # the thread touches the engine no more: another loop may drive it
            self._unclaim()

    def _unclaim(self) -> None:
        with _CLAIMS_LOCK:
            if _CLAIMS.get(self.engine) is self:
                del _CLAIMS[self.engine]

    def _serve(self) -> None:
        stalled = False
        while not self._closed.is_set():
            # Idle, or stalled (requests wait and none could be scheduled): sleep until a
            # command (an abort, a restore, a new request) may change that.
            self._drain(block=stalled or not self.engine.has_unfinished())
            if self._closed.is_set() or not self.engine.has_unfinished():
                continue
            outputs = self._step()
            if outputs is not None:
                stalled = self._deliver(outputs)
        self._shut_down()

    def _step(self) -> list[RequestOutput] | None:
        """One engine step, counted; None when it raised (an engine bug: every caller is
        failed and every block freed)."""
        try:
            outputs = self.engine.step()
        except BaseException as exc:  # handed to every caller, as the step's error
            self._abort_all(error=exc)
            return None
        self._num_steps += 1
        return outputs

    def _deliver(self, outputs: list[RequestOutput]) -> bool:
        """Hand a step's outputs to their streams; True when the step stalled (nothing
        came out and nothing runs: only a command can change that)."""
        # Before any output is pushed: a caller whose request just ended reads a
        # snapshot in which its blocks are already free.
        self._publish()
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            try:
                stream._push(output)
            except Exception:  # a broken sink must not end the engine thread
                self._abort(output.request_id)
                continue
            if output.finished:
                self._complete(output.request_id)
        return not outputs and not self.engine.scheduler.running

    def _drain(self, *, block: bool) -> None:
        try:
            command = self._commands.get(timeout=self._idle_wait_s) if block else None
            if command is not None:
                command.run(self._publish)
            while not self._closed.is_set():
                self._commands.get_nowait().run(self._publish)
        except queue.Empty:
            return

    def _publish(self) -> None:
        """Swap in a new snapshot (on the engine thread; one reference store)."""
        self._snapshot = take(self.engine, self._num_steps)

    def _shut_down(self) -> None:
        """Closed, and nothing can be queued any more: fail what was, abort the rest."""
        error = EngineLoopClosedError()
        while True:
            try:
                self._commands.get_nowait().fail(error)
            except queue.Empty:
                break
        self._abort_all()

    def _complete(self, request_id: str) -> None:
        stream = self._streams.pop(request_id)
        stream._finish(self.engine.pop_completion(request_id))

    def _abort(self, request_id: str) -> None:
        if request_id in self._streams:
            self.engine.abort(request_id)
            self._publish()  # before the consumer wakes: it reads its blocks freed
            self._complete(request_id)

    def _abort_all(self, error: BaseException | None = None) -> None:
        for request_id in list(self._streams):
            self.engine.abort(request_id)
        # Before any consumer wakes, as in _abort; an engine whose step failed may not
        # read back, and its old snapshot stands then.
        with contextlib.suppress(Exception):
            self._publish()
        for request_id in list(self._streams):
            stream = self._streams.pop(request_id)
            completion = self.engine.pop_completion(request_id)
            if error is None:
                stream._finish(completion)
            else:
                stream._fail(error)
