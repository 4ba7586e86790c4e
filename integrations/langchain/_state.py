"""What ``GovernorMiddleware`` keeps in the agent's graph state, and the run's lease.

Private to integrations/. ``GovernorState`` extends LangChain's ``AgentState`` the way
its call-limit middlewares do (``NotRequired`` fields with ``OmitFromSchema``
annotations):

- ``kvgov_run``: the ``RunHandle`` of the current agent invocation. An
  ``UntrackedValue``, so it is never checkpointed: a resumed thread starts a new run
  with a new handle. Private: in neither the input nor the output schema.
- counters, summed across the thread's runs (checkpointed with the thread): each update
  is an increment (``kvgov_peak_tokens``: a candidate for the maximum), so parallel tool
  calls may all report in one step; the reducer comes last in ``Annotated``, where
  LangGraph looks for it. Left out of the input schema, returned in the output:
  ``result["kvgov_model_calls"]``.

A ``RunHandle`` holds the lease one invocation runs in, taken at its first model call
(``GovernorMiddleware.wrap_model_call``) and released once (``close``): when the run
ends (``after_agent``), when an error leaves a model or tool call, or, as a last resort
for an error raised elsewhere, when the handle is garbage-collected with the run's
channels (``weakref.finalize``). A finalizer may run inside any code, a governor's
locked section included, so it only enqueues the lease (``SimpleQueue.put`` is safe
there); one daemon thread per process (``_Reaper``, started with the first lease held)
releases what was enqueued.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
import queue
import threading
import warnings
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Annotated

from langchain.agents.middleware.types import (
    AgentState,
    OmitFromInput,
    PrivateStateAttr,
    ResponseT,
)
from langgraph.channels.untracked_value import UntrackedValue
from typing_extensions import NotRequired

from governor import Governor, Lease, LeaseState
from integrations._control_flow import failure

__all__ = ["GovernorState", "RunHandle"]


class RunHandle:
    """One agent invocation's lease (None until its first model call)."""

    __slots__ = ("__weakref__", "_finalizer", "_lock", "lease")

    def __init__(self) -> None:
        self.lease: Lease | None = None
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        lease = "none" if self.lease is None else self.lease.lease_id
        return f"<RunHandle lease={lease}>"

    def live(self) -> Lease | None:
        """The run's lease, unless it has none or it was released."""
        lease = self.lease
        return None if lease is None or lease.state is LeaseState.RELEASED else lease

    def hold(self, governor: Governor, lease: Lease) -> Lease:
        """Keep ``lease`` as the run's; it is released by ``close`` or with the handle."""
        _REAPER.start()
        with self._lock:
            assert self.live() is None, "a run holds one lease at a time"
            self.lease = lease
            self._finalizer = weakref.finalize(self, _REAPER.put, governor, lease)
            self._finalizer.atexit = False  # a process that exits returns everything anyway
        return lease

    @contextlib.contextmanager
    def closing_on_error(self) -> Iterator[None]:
        """An error or a cancellation leaving the block ends the run: release its lease."""
        try:
            yield
        except BaseException as exc:
            self.close(error=failure(exc))
            raise

    @contextlib.asynccontextmanager
    async def aclosing_on_error(self) -> AsyncIterator[None]:
        """``closing_on_error`` for async hooks: the release runs off the event loop."""
        try:
            yield
        except BaseException as exc:
            await self.aclose(error=failure(exc))
            raise

    async def aclose(self, *, error: BaseException | None = None) -> None:
        """``close`` on a worker thread (releasing closes an engine budget), seen through
        even when the caller is cancelled while it runs."""
        if self._finalizer is None:
            return
        await asyncio.shield(asyncio.to_thread(self.close, error=error))

    def close(self, *, error: BaseException | None = None) -> None:
        """Release the run's lease, if it holds one (idempotent); ``error``: what ended
        the run, when it failed."""
        with self._lock:
            finalizer, self._finalizer = self._finalizer, None
        held = None if finalizer is None else finalizer.detach()
        if held is not None:
            _, _, (governor, lease), _ = held
            governor.release(lease, error=error)


class _Reaper:
    """Releases the leases of runs that were garbage-collected (see the module docstring)."""

    __slots__ = ("_lock", "_queue", "_thread")

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Governor, Lease]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvgov-reaper", daemon=True)
                self._thread.start()

    def put(self, governor: Governor, lease: Lease) -> None:
        self._queue.put((governor, lease))

    def _run(self) -> None:
        while True:
            governor, lease = self._queue.get()
            try:
                governor.release(lease)
            except Exception as exc:  # a failing admission policy: say so, keep reaping
                warnings.warn(
                    f"releasing lease {lease.lease_id} of a collected agent run failed: {exc!r}",
                    RuntimeWarning,
                    stacklevel=1,
                )


_REAPER = _Reaper()  # one per process: finalizers need a place that outlives every run


def _larger(current: int, update: int) -> int:
    return max(current, update)  # a reducer needs a signature, which the builtin lacks


class GovernorState(AgentState[ResponseT]):
    """``AgentState`` plus the governor's run handle and counters."""

    kvgov_run: NotRequired[Annotated[RunHandle, UntrackedValue, PrivateStateAttr]]
    kvgov_model_calls: NotRequired[Annotated[int, OmitFromInput, operator.add]]
    kvgov_compactions: NotRequired[Annotated[int, OmitFromInput, operator.add]]
    kvgov_tokens_compacted: NotRequired[Annotated[int, OmitFromInput, operator.add]]
    kvgov_tool_tokens_saved: NotRequired[Annotated[int, OmitFromInput, operator.add]]
    kvgov_input_tokens: NotRequired[Annotated[int, OmitFromInput, operator.add]]
    kvgov_output_tokens: NotRequired[Annotated[int, OmitFromInput, operator.add]]
    kvgov_peak_tokens: NotRequired[Annotated[int, OmitFromInput, _larger]]
