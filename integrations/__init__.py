"""Adapters from kvgov to other libraries: LangChain and LangGraph middleware,
OpenTelemetry instrumentation, a JSON-lines span exporter, the run report, and the
backends: ``RemoteBackend`` (the governor driving an engine behind ``kvgov serve``, over
httpx); for engines kvgov did not build, ``OpenAICompatibleBackend`` (any
OpenAI-compatible server), ``VLLMBackend``, ``SGLangBackend`` and ``LlamaCppBackend``
(llama.cpp's llama-server); and ``MultiBackend`` (several replicas behind one backend,
routed by cached prefix, or by vLLM's own KV events through ``KVEventIndex``).

Integrations use the public API of governor/ and policies/ and of their own
third-party library, never engine/.
"""

from __future__ import annotations

from integrations.jsonl import JsonLinesSpanExporter, SpanRecord, read_spans
from integrations.kv_events import KVEventError, KVEventIndex
from integrations.langchain import GovernedChatModel, GovernorMiddleware, GovernorState
from integrations.langgraph import GovernedGraph, govern
from integrations.llamacpp_backend import LlamaCppBackend
from integrations.multi_backend import MultiBackend, Routing
from integrations.openai_backend import OpenAICompatibleBackend
from integrations.otel import Instrumentation, instrument
from integrations.remote_backend import InvalidNameError, RemoteBackend
from integrations.report import RunReport
from integrations.sglang_backend import SGLangBackend
from integrations.vllm_backend import VLLMBackend

__all__ = [
    "GovernedChatModel",
    "GovernedGraph",
    "GovernorMiddleware",
    "GovernorState",
    "Instrumentation",
    "InvalidNameError",
    "JsonLinesSpanExporter",
    "KVEventError",
    "KVEventIndex",
    "LlamaCppBackend",
    "MultiBackend",
    "OpenAICompatibleBackend",
    "RemoteBackend",
    "Routing",
    "RunReport",
    "SGLangBackend",
    "SpanRecord",
    "VLLMBackend",
    "govern",
    "instrument",
    "read_spans",
]
