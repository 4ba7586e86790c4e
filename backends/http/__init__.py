"""What the HTTP backends share: the pooled HTTP/1.1 ``Transport`` (sync and async), the
errors rebuilt from an engine's error bodies, and the probes that read an engine kvgov
did not build (``EngineProbe`` -> ``EngineReading``, Prometheus text, checked shapes)."""

from __future__ import annotations

from backends.http._http11 import AnswerLimits, Reply
from backends.http.errors import InvalidNameError, error_from_response, remote_error_class
from backends.http.probe import EngineProbe, EngineReading, ProbeHTTP, SlotReading
from backends.http.transport import HttpLifecycle, Retries, Transport

__all__ = [
    "AnswerLimits",
    "EngineProbe",
    "EngineReading",
    "HttpLifecycle",
    "InvalidNameError",
    "ProbeHTTP",
    "Reply",
    "Retries",
    "SlotReading",
    "Transport",
    "error_from_response",
    "remote_error_class",
]
