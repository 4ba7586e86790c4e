"""``MultiBackend``: several replicas of one model behind one backend, routed by cached
prefix (``Routing``) or by vLLM's KV-cache events (``KVEventIndex``), failed over."""

from __future__ import annotations

from backends.multi.backend import MultiBackend, Routing
from backends.multi.kv_events import KVEventError, KVEventIndex

__all__ = ["KVEventError", "KVEventIndex", "MultiBackend", "Routing"]
