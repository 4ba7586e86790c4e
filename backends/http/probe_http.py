"""``TransportProbeHTTP``: the ``ProbeHTTP`` a probe reads an engine through, on the
backend's own pooled ``Transport`` (its timeouts, retries of GETs and typed errors).

A route the engine does not have (404), or has switched off (llama-server answers 501
for ``/metrics`` without ``--metrics`` and for ``/slots`` with ``--no-slots``), reads as
``None``: the probe reports the field missing. Anything else that fails (the engine is
away, a 5xx) raises ``BackendUnavailable``, so a restart is never read as a missing field.
"""

from __future__ import annotations

from typing import Any

from backends.http.transport import Transport
from governor import BackendError

__all__ = ["TransportProbeHTTP"]

_ABSENT = (404, 405, 501)


class TransportProbeHTTP:
    __slots__ = ("_transport",)

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    @property
    def base_url(self) -> str:
        return self._transport.base_url

    def get_text(self, path: str) -> str | None:
        response = self._get(path)
        return None if response is None else response.text

    def get_json(self, path: str) -> Any | None:
        response = self._get(path)
        return None if response is None else response.json()

    def _get(self, path: str) -> Any | None:
        try:
            return self._transport.request("GET", path)
        except BackendError as exc:
            if getattr(exc, "status_code", None) in _ABSENT:
                return None
            raise
