"""``kvgov report RUN.jsonl``: a run recorded with ``integrations.otel`` and
``JsonLinesSpanExporter`` read back (``RunReport``), with what to change for the next run.

Every figure is computed from the spans alone, by the names in ``integrations.otel.names``.
"""

from __future__ import annotations

from integrations.report._render import render
from integrations.report.figures import AgentFigures, Spread
from integrations.report.main import report_main
from integrations.report.run_report import ReportError, RunReport

__all__ = ["AgentFigures", "ReportError", "RunReport", "Spread", "render", "report_main"]
