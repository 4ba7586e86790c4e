"""``ModelsProbe``: what any OpenAI-compatible server says of itself, the default probe of
``OpenAICompatibleBackend``.

``GET /v1/models`` lists the served model; vLLM adds ``max_model_len`` to each entry and
llama-server ``meta.n_ctx`` (one slot's context). Neither says the KV capacity there, so
the reading reports it missing and the backend falls back to the capacity the user
declared. A body of another shape reads as nothing said.
"""

from __future__ import annotations

from typing import Any

from backends.http.probe import EngineReading
from backends.http.probe_shape import read_checked

__all__ = ["ModelsProbe"]


class ModelsProbe:
    """The one figure every OpenAI-compatible server may give: the context of the served
    model in ``GET /v1/models`` (vLLM's ``max_model_len``, llama-server's ``meta.n_ctx``)."""

    @property
    def engine(self) -> str:
        return "openai"

    def read(self, http: Any) -> EngineReading:
        return read_checked(self.engine, http, lambda: self._read(http))

    def _read(self, http: Any) -> EngineReading:
        body = http.get_json("/v1/models")
        cards = body.get("data") if isinstance(body, dict) else None
        for entry in cards if isinstance(cards, list) else ():
            if not isinstance(entry, dict):
                continue
            meta = entry.get("meta")
            if not isinstance(meta, dict):
                meta = {}
            length = entry.get("max_model_len") or meta.get("n_ctx")
            if isinstance(length, int) and not isinstance(length, bool) and length > 0:
                return EngineReading(max_model_len=length, missing=("KV capacity",))
        return EngineReading(missing=("KV capacity", "the model's context length"))
