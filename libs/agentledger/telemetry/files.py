"""A test hook: spans, metric points and log records as JSON lines in one file.

Set ``AGENTLEDGER_TELEMETRY_FILE=<path>`` on a process and everything it would export is
appended to that file, one JSON object per line with a ``signal`` of ``span``, ``metric`` or
``log``: tests assert on subprocess telemetry without a collector. Not for production.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class Lines:
    """An append-only JSON-lines file shared by the exporters of one process."""

    def __init__(self, path: Path | str, service: str) -> None:
        self.path, self.service = Path(path), service
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        if not records:
            return
        text = "".join(json.dumps({"service": self.service, **r}, default=str) + "\n"
                       for r in records)
        # One write per batch under a lock: lines from exporter threads never interleave.
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(text)


def _hex(value: int, width: int) -> str:
    return f"{value:0{width}x}"


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """The JSON shape of one finished span (ids in W3C hex)."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "signal": "span", "name": span.name, "kind": span.kind.name,
        "scope": span.instrumentation_scope.name if span.instrumentation_scope else None,
        "trace_id": _hex(ctx.trace_id, 32), "span_id": _hex(ctx.span_id, 16),
        "parent_span_id": _hex(span.parent.span_id, 16) if span.parent else None,
        "start_ns": span.start_time, "end_ns": span.end_time,
        "status": span.status.status_code.name, "status_description": span.status.description,
        "attributes": dict(span.attributes or {}),
        "links": [{"trace_id": _hex(link.context.trace_id, 32),
                   "span_id": _hex(link.context.span_id, 16),
                   "attributes": dict(link.attributes or {})} for link in span.links],
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})}
                   for e in span.events],
    }


class SpanFileExporter(SpanExporter):
    """Writes each finished span as a line (pair with a ``SimpleSpanProcessor``)."""

    def __init__(self, lines: Lines) -> None:
        self._lines = lines

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._lines.write([span_record(s) for s in spans])
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class MetricFileExporter(MetricExporter):
    """Writes every data point of every collection as a line."""

    def __init__(self, lines: Lines) -> None:
        super().__init__()
        self._lines = lines

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **_kwargs: Any) -> MetricExportResult:
        out: list[dict[str, Any]] = []
        for resource in metrics_data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        record: dict[str, Any] = {
                            "signal": "metric", "name": metric.name, "unit": metric.unit,
                            "attributes": dict(point.attributes or {})}
                        if isinstance(point, NumberDataPoint):
                            record["value"] = point.value
                        elif isinstance(point, HistogramDataPoint):
                            record |= {"count": point.count, "sum": point.sum}
                        out.append(record)
        self._lines.write(out)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **_kwargs: Any) -> None:
        pass


class LogFileHandler(logging.Handler):
    """Writes each log record as a line, with the active trace and span ids."""

    def __init__(self, lines: Lines) -> None:
        super().__init__(logging.INFO)
        self._lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            ctx = trace.get_current_span().get_span_context()
            line: dict[str, Any] = {
                "signal": "log", "level": record.levelname, "logger": record.name,
                "message": record.getMessage(),
                "trace_id": _hex(ctx.trace_id, 32) if ctx.is_valid else None,
                "span_id": _hex(ctx.span_id, 16) if ctx.is_valid else None}
            if record.exc_info:
                line["exception"] = logging.Formatter().formatException(record.exc_info)
            self._lines.write([line])
        except Exception:
            self.handleError(record)
