"""``EngineBackend``: an ``OpenAICompatibleBackend`` for an engine that takes a priority and
a cache salt per request (vLLM, SGLang), with the probe that reads it.

What each call adds to the plain OpenAI body (``backends.openai._engine_requests`` says why):
- ``cache_salt``: the governor's salt (the tenant) as an HMAC under this backend's
  ``salt_key`` (random per backend unless given: give the same key to every backend of one
  deployment so that their prefix caches keep hitting across client restarts);
- ``priority``: the lease's priority in the engine's polarity, only where the engine
  schedules by priority (the probe's ``priority_rule``, asked once and again after a
  restart); a vLLM that refuses it (0.10 and earlier under FCFS) is sent none after that
  first refusal, and the refused call is sent again without it (the engine ran nothing).
"""

from __future__ import annotations

import secrets
import threading
from typing import Any, Protocol

import httpx

from backends.http import Reply
from backends.http.probe import EngineProbe, ProbeHTTP
from backends.http.probe_http import TransportProbeHTTP
from backends.openai._engine_requests import PriorityRule, engine_cache_salt, is_priority_rejection
from backends.openai.backend import OpenAICompatibleBackend
from governor import BackendError, GenerationRequest

__all__ = ["EngineBackend"]


class PriorityProbe(EngineProbe, Protocol):
    def priority_rule(self, http: ProbeHTTP) -> PriorityRule: ...


class EngineBackend(OpenAICompatibleBackend):
    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        probe: PriorityProbe,
        salt_key: bytes | None = None,
        **options: Any,
    ) -> None:
        self._priority_probe = probe  # before the base's __init__, which asks self.name
        super().__init__(base_url, model=model, probe=probe, **options)
        self._salt_key = salt_key if salt_key is not None else secrets.token_bytes(32)
        self._rule: PriorityRule | None = None
        self._rule_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._priority_probe.engine

    def priority_rule(self) -> PriorityRule:
        """Whether and how this engine takes a priority (asked once per engine instance)."""
        with self._rule_lock:
            if self._rule is None:
                http = TransportProbeHTTP(self._transport)
                self._rule = self._priority_probe.priority_rule(http)
            return self._rule

    def _extras(self, request: GenerationRequest, body: dict[str, Any]) -> None:
        salt = engine_cache_salt(request.cache_salt, key=self._salt_key)
        if salt is not None:
            body["cache_salt"] = salt
        value = self.priority_rule().value(request.priority)
        if value:  # 0 is every engine's default: the body stays plain
            body["priority"] = value

    def _send(self, path: str, body: dict[str, Any]) -> httpx.Response | Reply:
        try:
            return super()._send(path, body)
        except BackendError as exc:
            status = getattr(exc, "status_code", 0)
            if "priority" not in body or not is_priority_rejection(status, str(exc)):
                raise
        with self._rule_lock:
            self._rule = PriorityRule(
                enabled=False,
                lower_first=self._rule.lower_first if self._rule else True,
                reason="the server refused a priority: it does not schedule by priority",
            )
        return super()._send(path, {key: v for key, v in body.items() if key != "priority"})

    def _engine_state_lost(self) -> None:
        super()._engine_state_lost()
        with self._rule_lock:
            self._rule = None  # a restarted engine may schedule otherwise
