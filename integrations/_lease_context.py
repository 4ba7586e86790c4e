"""The lease the running code works in: one context variable for all of integrations/.

Private to integrations/. Two things set it, for as long as they run:

- ``govern``: a governed LangGraph node execution, to its node's lease
  (``integrations.langgraph._node``);
- ``GovernorMiddleware``: a model call of a ``create_agent`` run, to the run's lease
  (``integrations.langchain``).

Two things read it: ``GovernedChatModel`` calls in it when it is given no lease of its
own, and a governed graph invoked within it takes it as the parent of its leases (or
shares it with its nodes of the same agent). It is a ``contextvars.ContextVar``, and
LangChain and LangGraph copy the context into the threads and tasks they run nested
runnables in, so code the scope calls, directly or not, sees it.
"""

from __future__ import annotations

import contextvars
from types import TracebackType

from governor import Governor, Lease, LeaseState

__all__ = ["LeaseScope", "current_lease"]

_CURRENT: contextvars.ContextVar[Lease | None] = contextvars.ContextVar(
    "kvgov_current_lease", default=None
)


def current_lease(governor: Governor | None = None) -> Lease | None:
    """The lease the running code works in: a governed graph node's, or a
    ``GovernorMiddleware`` run's during its model call. None outside one, once it is
    released, and, with ``governor``, when it is another governor's."""
    lease = _CURRENT.get()
    if lease is None or lease.state is LeaseState.RELEASED:
        return None
    if governor is not None and lease.governor is not governor:
        return None
    return lease


class LeaseScope:
    """``with LeaseScope(lease):``: within the block, ``lease`` is the current lease."""

    __slots__ = ("_lease", "_token")

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._token: contextvars.Token[Lease | None] | None = None

    def __enter__(self) -> Lease:
        self._token = _CURRENT.set(self._lease)
        return self._lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._token is not None, "a scope is exited once, after it was entered"
        _CURRENT.reset(self._token)
        self._token = None
