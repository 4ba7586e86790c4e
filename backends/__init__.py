"""How the governor reaches KV: the backends that implement ``governor.Backend``.

- ``LocalBackend`` (backends.local): the bundled engine, in process; the one place
  that imports engine/, lazily, so ``import backends`` does not import torch.
- ``RemoteBackend`` (backends.remote): the bundled engine behind ``kvgov serve``, over httpx.
- ``OpenAICompatibleBackend``, ``VLLMBackend``, ``SGLangBackend``, ``LlamaCppBackend``
  (backends.openai): engines kvgov did not build, read through their own routes.
- ``MultiBackend`` (backends.multi): several replicas behind one backend, routed by cached
  prefix or by vLLM's KV events (``KVEventIndex``).
- backends.http: the pooled HTTP/1.1 transport and the probes the HTTP backends share.

Backends use the public API of governor/; nothing below them imports them. Each name is
imported from its subpackage when first used, so ``from backends import LocalBackend``
needs neither httpx's transport nor pydantic (the GPU machine's image has no httptools).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends.http import EngineProbe, EngineReading, InvalidNameError
    from backends.local import LocalBackend
    from backends.multi import KVEventError, KVEventIndex, MultiBackend, Routing
    from backends.openai import (
        LlamaCppBackend,
        OpenAICompatibleBackend,
        SGLangBackend,
        VLLMBackend,
    )
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

_SUBPACKAGE = {
    "EngineProbe": "backends.http",
    "EngineReading": "backends.http",
    "InvalidNameError": "backends.http",
    "KVEventError": "backends.multi",
    "KVEventIndex": "backends.multi",
    "LlamaCppBackend": "backends.openai",
    "LocalBackend": "backends.local",
    "MultiBackend": "backends.multi",
    "OpenAICompatibleBackend": "backends.openai",
    "RemoteBackend": "backends.remote",
    "Routing": "backends.multi",
    "SGLangBackend": "backends.openai",
    "VLLMBackend": "backends.openai",
}


def __getattr__(name: str) -> Any:
    subpackage = _SUBPACKAGE.get(name)
    if subpackage is None:
        raise AttributeError(f"module 'backends' has no attribute {name!r}")
    value = getattr(importlib.import_module(subpackage), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
