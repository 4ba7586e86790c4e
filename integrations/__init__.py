"""Adapters from kvgov to other libraries: LangChain and LangGraph middleware,
OpenTelemetry instrumentation and HTTP backends.

Integrations use the public API of governor/ and policies/ and of their own
third-party library, never engine/.
"""

from __future__ import annotations

from integrations.langgraph import GovernedGraph, govern

__all__ = ["GovernedGraph", "govern"]
