"""Adapters from kvgov to other libraries: LangChain and LangGraph middleware,
OpenTelemetry instrumentation, a JSON-lines span exporter and the run report.

Integrations use the public API of governor/ and policies/ and of their own
third-party library, never engine/; the backends that reach an engine are in backends/.
"""

from __future__ import annotations

from integrations.jsonl import JsonLinesSpanExporter, SpanRecord, read_spans
from integrations.langchain import GovernedChatModel, GovernorMiddleware, GovernorState
from integrations.langgraph import GovernedGraph, govern
from integrations.otel import Instrumentation, instrument
from integrations.report import RunReport

__all__ = [
    "GovernedChatModel",
    "GovernedGraph",
    "GovernorMiddleware",
    "GovernorState",
    "Instrumentation",
    "JsonLinesSpanExporter",
    "RunReport",
    "SpanRecord",
    "govern",
    "instrument",
    "read_spans",
]
