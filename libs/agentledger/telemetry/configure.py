"""OpenTelemetry SDK set up from the standard ``OTEL_*`` environment (R8.1).

Nothing is exported by default. OTLP is used only when an endpoint is configured
(``OTEL_EXPORTER_OTLP_ENDPOINT``, or the per-signal ``..._TRACES_ENDPOINT`` /
``..._METRICS_ENDPOINT``), over ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc`` by default, or
``http/protobuf``). ``OTEL_SDK_DISABLED=true`` turns everything off; the sampler, batch and
export intervals follow their standard variables. ``AGENTLEDGER_TELEMETRY_FILE`` adds the
JSON-lines test hook of ``telemetry.files``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader as Periodic
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

from agentledger.telemetry import files
from agentledger.telemetry.unrecorded import UnrecordedTracerProvider

FILE_ENV: Final = "AGENTLEDGER_TELEMETRY_FILE"
# The file hook is read by tests waiting on a subprocess: a point every half second keeps
# waits short; the standard variable still wins when set.
FILE_METRIC_INTERVAL_MS: Final = 500

log = logging.getLogger(__name__)


@dataclass
class Telemetry:
    """What ``setup`` installed; ``shutdown`` flushes it (also registered at exit)."""

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    exporters: list[str] = field(default_factory=list)
    log_handler: logging.Handler | None = None

    def shutdown(self) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()
        if self.log_handler is not None:
            logging.getLogger().removeHandler(self.log_handler)


_installed: Telemetry | None = None


def _wanted(env: Mapping[str, str], signal: str) -> bool:
    if env.get(f"OTEL_{signal}_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"))


def _otlp(env: Mapping[str, str]) -> tuple[SpanExporter | None, MetricExporter | None]:
    """OTLP exporters for the signals that have an endpoint (they read their own env)."""
    traces, metrics_ = _wanted(env, "TRACES"), _wanted(env, "METRICS")
    if not (traces or metrics_):
        return None, None
    protocol = env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc").strip().lower()
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
                OTLPSpanExporter,
            )
    except ImportError:
        log.warning("event=telemetry.otlp_missing hint=install opentelemetry-exporter-otlp")
        return None, None
    return (OTLPSpanExporter() if traces else None,
            OTLPMetricExporter() if metrics_ else None)


def setup(service_name: str, *, environ: Mapping[str, str] | None = None) -> Telemetry:
    """Install the global tracer and meter providers for this process (once).

    Call it in a service's entry point after logging is configured: with the file hook on,
    a log handler is added to the root logger.

    Args:
        service_name: ``service.name`` unless ``OTEL_SERVICE_NAME`` says otherwise.
        environ: the environment to read (``os.environ`` by default).
    """
    global _installed
    if _installed is not None:
        return _installed
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        _installed = Telemetry()
        return _installed
    name = env.get("OTEL_SERVICE_NAME") or service_name
    resource = Resource.create({SERVICE_NAME: name})
    readers: list[MetricReader] = []
    processors: list[SpanProcessor] = []
    installed = Telemetry()
    span_exporter, metric_exporter = _otlp(env)
    if span_exporter is not None:
        processors.append(BatchSpanProcessor(span_exporter))
        installed.exporters.append("otlp-traces")
    if metric_exporter is not None:
        readers.append(Periodic(metric_exporter))
        installed.exporters.append("otlp-metrics")
    path = env.get(FILE_ENV)
    if path:
        lines = files.Lines(path, name)
        # Simple (synchronous) processor: a span is on disk when it ends, even if the
        # process is killed right after.
        processors.append(SimpleSpanProcessor(files.SpanFileExporter(lines)))
        interval = None if env.get("OTEL_METRIC_EXPORT_INTERVAL") else FILE_METRIC_INTERVAL_MS
        readers.append(Periodic(files.MetricFileExporter(lines),
                                export_interval_millis=interval))
        installed.log_handler = files.LogFileHandler(lines)
        logging.getLogger().addHandler(installed.log_handler)
        installed.exporters.append("file")
    # Spans are recorded only for someone: an exporter, or a sampler asked for by name.
    # Otherwise they carry their W3C context and nothing else (``telemetry.unrecorded``).
    if processors or env.get("OTEL_TRACES_SAMPLER"):
        installed.tracer_provider = TracerProvider(resource=resource)
        for processor in processors:
            installed.tracer_provider.add_span_processor(processor)
        trace.set_tracer_provider(installed.tracer_provider)
    else:
        trace.set_tracer_provider(UnrecordedTracerProvider())
    # Measurements likewise: the SDK's meter provider with no reader still builds and cleans
    # each measurement (~5 µs a histogram record and counter add) to aggregate it for nobody.
    if readers:
        installed.meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(installed.meter_provider)
    else:
        metrics.set_meter_provider(metrics.NoOpMeterProvider())
    _installed = installed
    log.info("event=telemetry.ready service=%s exporters=%s", name,
             ",".join(installed.exporters) or "none")
    return installed
