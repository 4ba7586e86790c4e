"""Adapters from kvgov to other libraries, one subpackage per framework: langchain/
(``GovernorMiddleware``, ``GovernedChatModel``), langgraph/ (``govern``), otel/
(``instrument``) and report/ (``RunReport``, ``kvgov report``); at the top, the JSON-lines
span exporter (jsonl) and the private pieces several subpackages share.

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
