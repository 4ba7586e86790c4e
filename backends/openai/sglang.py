"""``SGLangBackend``: an SGLang server (``python -m sglang.launch_server``) behind the
governor.

Capacity and pressure from ``SGLangProbe`` (``/server_info``, ``/v1/loads``,
``/metrics``), summed over data-parallel ranks; ``cache_salt`` per tenant; ``priority``
in the server's polarity (higher first unless ``--schedule-low-priority-values-first``),
sent only with ``--enable-priority-scheduling``, as ``/server_info`` says. The rest as
``OpenAICompatibleBackend``.
"""

from __future__ import annotations

from typing import Any

from backends.openai._engine_backend import EngineBackend
from backends.openai._sglang_probe import SGLangProbe

__all__ = ["SGLangBackend"]


class SGLangBackend(EngineBackend):
    def __init__(
        self, base_url: str, *, model: str, salt_key: bytes | None = None, **options: Any
    ) -> None:
        super().__init__(base_url, model=model, probe=SGLangProbe(), salt_key=salt_key, **options)
