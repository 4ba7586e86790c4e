"""OpenTelemetry for the governor: ``instrument`` draws spans, span events and metrics from
its event stream (``Instrumentation`` is the handle that undoes it).

``integrations.otel.names`` holds every span, attribute and metric name written, and is
what readers of the spans (``kvgov report``, ``kvgov plan --trace``) read them by.
"""

from __future__ import annotations

from integrations.otel.instrumentation import Instrumentation, instrument

__all__ = ["Instrumentation", "instrument"]
