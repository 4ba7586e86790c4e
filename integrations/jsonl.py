"""Spans as JSON lines: an OpenTelemetry ``SpanExporter`` that writes one object per span,
and ``read_spans`` to load them back (``kvgov report RUN.jsonl`` reads them).

    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter("run.jsonl")))

Each line is one finished span::

    {"name": "chat tiny-random", "kind": "CLIENT", "trace_id": "<32 hex>",
     "span_id": "<16 hex>", "parent_span_id": "<16 hex>" | null, "start_ns": ...,
     "end_ns": ..., "attributes": {...}, "events": [{"name", "time_ns", "attributes"}],
     "status": {"code": "UNSET" | "OK" | "ERROR", "description": ... | null},
     "scope": "kvgov"}

Attribute values are JSON scalars or lists (OpenTelemetry's tuples). Export is
thread-safe and flushes after every batch, so a run that crashes leaves every span it
finished. A path is opened here (truncated, or appended to with ``append=True``) and
closed at ``shutdown``; a file object is written to and left open for its owner.

Errors: ``read_spans`` raises ``SpanFileError`` (a ``ValueError``, with ``path`` and
``line``) for a line that is not a span, and lets ``OSError`` through for a file that
cannot be read.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["EventRecord", "JsonLinesSpanExporter", "SpanFileError", "SpanRecord", "read_spans"]


class SpanFileError(ValueError):
    """A line of a span file that is not a span written by ``JsonLinesSpanExporter``."""

    def __init__(self, path: str, line: int, problem: str) -> None:
        super().__init__(f"{path}, line {line}: {problem}")
        self.path = path
        self.line = line


@dataclass(frozen=True, slots=True)
class EventRecord:
    name: str
    time_ns: int
    attributes: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One span as read back from a JSON-lines file."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    events: tuple[EventRecord, ...]
    status: str  # "UNSET", "OK" or "ERROR"
    status_description: str | None = None
    kind: str = "INTERNAL"


class JsonLinesSpanExporter(SpanExporter):
    """Writes each finished span as one JSON line to a path or a text file object."""

    def __init__(
        self, path_or_file: str | os.PathLike[str] | IO[str], *, append: bool = False
    ) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        if isinstance(path_or_file, (str, os.PathLike)):
            mode = "a" if append else "w"
            # Closed at shutdown: the exporter outlives any block that opened it.
            self._file: IO[str] = open(path_or_file, mode, encoding="utf-8")  # noqa: SIM115
            self._owned = True
        else:
            self._file = path_or_file
            self._owned = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(_to_json(span), separators=(",", ":")) + "\n" for span in spans)
        with self._lock:
            if self._stopped:
                return SpanExportResult.FAILURE
            try:
                self._file.write(lines)
                self._file.flush()
            except (OSError, ValueError):  # a full disk, a closed file
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        with self._lock:
            if not self._stopped:
                self._file.flush()
        return True

    def shutdown(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            if self._owned:
                self._file.close()
            else:
                self._file.flush()


def _to_json(span: ReadableSpan) -> dict[str, Any]:
    """The JSON object one span is written as."""
    context = span.context
    assert context is not None, "a finished SDK span has a context"
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": _plain(span.attributes),
        "events": [
            {"name": e.name, "time_ns": e.timestamp, "attributes": _plain(e.attributes)}
            for e in span.events
        ],
        "status": {"code": span.status.status_code.name, "description": span.status.description},
        "scope": None if span.instrumentation_scope is None else span.instrumentation_scope.name,
    }


def read_spans(path: str | os.PathLike[str]) -> list[SpanRecord]:
    """Every span in a file written by ``JsonLinesSpanExporter``, in the order written."""
    name = os.fspath(path)
    spans = []
    with Path(path).open(encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if line.strip():
                spans.append(_record(name, number, line))
    return spans


def _record(path: str, number: int, line: str) -> SpanRecord:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SpanFileError(path, number, f"not JSON ({exc.msg})") from None
    try:
        status = d.get("status") or {}
        return SpanRecord(
            name=_str(d["name"]),
            trace_id=_str(d["trace_id"]),
            span_id=_str(d["span_id"]),
            parent_span_id=None if d.get("parent_span_id") is None else _str(d["parent_span_id"]),
            start_ns=_int(d["start_ns"]),
            end_ns=_int(d["end_ns"]),
            attributes=_dict(d.get("attributes", {})),
            events=tuple(
                EventRecord(_str(e["name"]), _int(e["time_ns"]), _dict(e.get("attributes", {})))
                for e in d.get("events", [])
            ),
            status=_str(status.get("code", "UNSET")),
            status_description=status.get("description"),
            kind=_str(d.get("kind", "INTERNAL")),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        problem = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        raise SpanFileError(path, number, f"not a span ({problem})") from None


def _plain(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in (attributes or {}).items()}


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, found {value!r}")
    return value


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, found {value!r}")
    return value


def _dict(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, found {value!r}")
    return value
