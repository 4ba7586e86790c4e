"""How the governor reaches KV: the backends that implement ``governor.Backend``.

- ``LocalBackend`` (backends.local): the bundled engine, in process; the one place
  that imports engine/, lazily, so ``import backends`` does not import torch.
- ``RemoteBackend`` (backends.remote): the bundled engine behind ``kvgov serve``, over httpx.
- ``OpenAICompatibleBackend``, ``VLLMBackend``, ``SGLangBackend``, ``LlamaCppBackend``
  (backends.openai): engines kvgov did not build, read through their own routes.
- ``MultiBackend`` (backends.multi): several replicas behind one backend, routed by cached
  prefix or by vLLM's KV events (``KVEventIndex``).
- backends.http: the pooled HTTP/1.1 transport and the probes the HTTP backends share.

Backends use the public API of governor/; nothing below them imports them.
"""

from __future__ import annotations

from backends.http import EngineProbe, EngineReading, InvalidNameError
from backends.local import LocalBackend
from backends.multi import KVEventError, KVEventIndex, MultiBackend, Routing
from backends.openai import LlamaCppBackend, OpenAICompatibleBackend, SGLangBackend, VLLMBackend
from backends.remote import RemoteBackend

__all__ = [
    "EngineProbe",
    "EngineReading",
    "InvalidNameError",
    "KVEventError",
    "KVEventIndex",
    "LlamaCppBackend",
    "LocalBackend",
    "MultiBackend",
    "OpenAICompatibleBackend",
    "RemoteBackend",
    "Routing",
    "SGLangBackend",
    "VLLMBackend",
]
