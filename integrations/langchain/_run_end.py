"""The end of a ``create_agent`` run, seen by ``GovernorMiddleware`` however the run ends.

Private to integrations/. No middleware hook runs when another node raises (another
middleware's ``after_model``, say), and LangGraph then keeps the run's state in reference
cycles (the exception's traceback holds the failing node's frame, its input, the loop)
until the garbage collector runs: left to the collector, the run's lease would stay
admitted until then. What does run, however a run ends, are its callbacks: LangGraph
reports the graph run's end (``on_chain_end``) or failure (``on_chain_error``: an error,
a cancellation, a stream closed early) to its callback manager's handlers before
``invoke`` returns or raises.

So one ``RunEnds`` handler is part of every callback manager LangChain configures in this
process: ``langchain_core.tracers.context.register_configure_hook`` with a context
variable whose default is the handler, as LangSmith's tracer is added, so nothing needs
setting in the caller's context (which the middleware never sees). It ignores every
event but a chain's end and error, is run inline (no executor hop in async managers),
and answers those with one emptiness check unless a governed run is in flight:

1. the run's first hook (``before_agent``, or the first model call of a run resumed from
   an interrupt) calls ``watch(node_run_id, handle)`` with its own node's run id;
2. that node's ``on_chain_end`` names its parent, the agent graph's run: the handle is
   filed under it;
3. the graph run's ``on_chain_end`` or ``on_chain_error`` closes the handle (its lease is
   released, with the error that ended the run) and forgets it.

The release runs inline in the callback, before ``invoke`` or ``ainvoke`` raises; in an
async run that is on the event loop (closing the lease's engine budget waits for one
engine step), on the failure path only: a run that ends well was released by
``aafter_agent`` off the loop already. Handles are held weakly: a run that never ends (a
stream abandoned and never closed) still releases its lease when collected
(``RunHandle``'s finalizer). State is guarded by one
lock, never held while a lease is released.
"""

from __future__ import annotations

import threading
import weakref
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers.context import register_configure_hook

from integrations._control_flow import failure
from integrations.langchain._state import RunHandle

__all__ = ["RUN_ENDS", "RunEnds"]

_PURGE_AT = 1_024  # filed runs; past it, those whose handles were all collected go

_Refs = list[weakref.ref[RunHandle]]


class RunEnds(BaseCallbackHandler):
    """Closes each watched run's handle when its agent graph run ends (module docstring)."""

    run_inline = True  # a dictionary lookup: no executor hop in async managers
    raise_error = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[UUID, _Refs] = {}  # the watching hook's node run -> handles
        self._runs: dict[UUID, _Refs] = {}  # the agent graph run -> handles

    def __repr__(self) -> str:
        return f"<RunEnds watching {len(self._nodes)} node(s), {len(self._runs)} run(s)>"

    @property
    def ignore_llm(self) -> bool:
        return True

    @property
    def ignore_chat_model(self) -> bool:
        return True

    @property
    def ignore_retriever(self) -> bool:
        return True

    @property
    def ignore_agent(self) -> bool:
        return True

    @property
    def ignore_retry(self) -> bool:
        return True

    @property
    def ignore_custom_event(self) -> bool:
        return True

    def watch(self, node_run_id: UUID, handle: RunHandle) -> None:
        """File ``handle`` under the run of the node ``node_run_id`` when that node ends."""
        with self._lock:
            self._nodes.setdefault(node_run_id, []).append(weakref.ref(handle))

    def on_chain_end(
        self,
        outputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if not (self._nodes or self._runs):  # nothing governed in flight: the common case
            return
        with self._lock:
            refs = self._nodes.pop(run_id, None)
            if refs is not None:
                if parent_run_id is not None:
                    self._runs.setdefault(parent_run_id, []).extend(refs)
                    if len(self._runs) > _PURGE_AT:
                        self._purge()
                return
            refs = self._runs.pop(run_id, None)
        _close(refs, None)

    def on_chain_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if not (self._nodes or self._runs):
            return
        with self._lock:
            self._nodes.pop(run_id, None)  # its own failure: the hook released already
            refs = self._runs.pop(run_id, None)
        # A caller that stops reading (GeneratorExit) ends the run, but is not its failure.
        _close(refs, None if isinstance(error, GeneratorExit) else failure(error))

    def _purge(self) -> None:
        """Forget runs whose handles were all collected (under ``_lock``)."""
        for run_id, refs in list(self._runs.items()):
            if all(ref() is None for ref in refs):
                del self._runs[run_id]


def _close(refs: _Refs | None, error: BaseException | None) -> None:
    for ref in refs or ():
        handle = ref()
        if handle is not None:
            handle.close(error=error)


RUN_ENDS = RunEnds()  # one per process: every callback manager carries it
_RUN_ENDS_VAR: ContextVar[RunEnds | None] = ContextVar("kvgov_run_ends", default=RUN_ENDS)
register_configure_hook(_RUN_ENDS_VAR, inheritable=True)
