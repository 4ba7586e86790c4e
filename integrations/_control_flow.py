"""What LangGraph raises through a node that fails nothing: its control flow.

Private to integrations/. ``interrupt()`` raises ``GraphInterrupt`` and a ``Command`` to
the parent graph raises ``ParentCommand`` (both ``GraphBubbleUp``) up through the node,
the middleware hook or the subgraph that holds a lease. The lease is released (or
parked) all the same, but its agent did not fail: the ``released`` event, and so the
agent's span, carry no error for them.
"""

from __future__ import annotations

from langgraph.errors import GraphBubbleUp

__all__ = ["failure"]


def failure(error: BaseException | None) -> BaseException | None:
    """``error``, unless it is LangGraph's control flow (``GraphBubbleUp``): then None."""
    return None if isinstance(error, GraphBubbleUp) else error
