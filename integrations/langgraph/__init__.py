"""LangGraph within the governor: ``govern`` turns any graph into a ``GovernedGraph`` whose
nodes run in leases; ``current_lease`` is the lease of the governed node running now.

``govern`` rests on a few LangGraph internals, named in
tests/integrations/langgraph/test_langgraph_internals.py; ``langgraph`` is pinned to the
minor version they were checked on.
"""

from __future__ import annotations

from integrations._lease_context import current_lease
from integrations.langgraph.governed_graph import GovernedGraph
from integrations.langgraph.graph import govern

__all__ = ["GovernedGraph", "current_lease", "govern"]
