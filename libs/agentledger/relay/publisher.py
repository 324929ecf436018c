"""The Kafka side of the relay: an idempotent producer and its delivery reports.

Delivery reports are served by a background thread so that the acknowledgement time (the
end of the lag measurement) does not depend on how often the streaming loop looks. The
thread only records the metric and queues the report; the streaming loop applies reports
to its checkpoint, so the bookkeeping stays single-threaded. A pipe wakes the loop.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from agentledger import errors
from agentledger.relay import metrics, pgoutput, routing
from agentledger.telemetry import spans

log = logging.getLogger(__name__)
tracer = trace.get_tracer("agentledger.relay")


@dataclass(frozen=True, slots=True)
class Report:
    """The outcome of one record: ``token`` is what the caller passed to ``publish``."""

    token: object
    ok: bool
    error: str | None


class Publisher:
    """Publishes records with ``acks=all`` and idempotence; reports come back via ``reports``.

    Args:
        bootstrap: Kafka bootstrap servers.
        linger_ms: producer batching delay.
        delivery_timeout_ms: retry window per record before it is failed.
        relay_metrics: where acknowledgements are measured.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        linger_ms: int,
        delivery_timeout_ms: int,
        relay_metrics: metrics.RelayMetrics,
    ) -> None:
        self._config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "client.id": "agentledger-relay",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": linger_ms,
            "message.timeout.ms": delivery_timeout_ms,
            # Java's default partitioner: a key lands on the same partition whether this
            # relay or Debezium (Kafka Connect) publishes it, so swapping keeps key order.
            "partitioner": "murmur2_random",
            # One local broker restarting should be found again within a second, not ten.
            "reconnect.backoff.max.ms": 1000,
            "error_cb": self._on_error,
        }
        self._metrics = relay_metrics
        self.reports: queue.SimpleQueue[Report] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._fatal = False
        self._producer = Producer(self._config)
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="relay-delivery", daemon=True)
        self._poller.start()

    @property
    def wake_fd(self) -> int:
        """Readable when reports are waiting."""
        return self._wake_r

    def drain_wake(self) -> None:
        """Consume the wake-up bytes (the reports themselves stay in ``reports``)."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def reset_if_fatal(self) -> None:
        """Replace a producer that hit a fatal idempotence error (its records are failed)."""
        if self._fatal:
            log.warning("event=relay.producer_reset reason=fatal_error")
            self._producer.flush(0)
            self._producer = Producer(self._config)
            self._fatal = False

    def publish(
        self, record: routing.Record, commit_time_us: int | None, token: object
    ) -> None:
        """Queue ``record``; its report arrives later in ``reports`` carrying ``token``.

        ``commit_time_us`` (pgoutput time) starts the lag measurement; ``None`` skips it.
        A ``relay.publish`` span, child of the context captured at admission (the row's
        ``traceparent``), lasts until the acknowledgement. The record carries that captured
        context unchanged, as its one ``traceparent`` header, like Debezium's router.

        Raises:
            DeliveryFailed: the producer refused the record outright.
        """
        span = _publish_span(record)
        on_delivery = self._callback(record.family, commit_time_us, token, span)
        while True:
            try:
                self._producer.produce(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers),
                    on_delivery=on_delivery,
                )
                return
            except BufferError:
                # Local queue full: wait for reports to make room (the poller serves them).
                time.sleep(0.01)
            except KafkaException as exc:
                spans.failed(span, exc)
                span.end()
                raise errors.DeliveryFailed(
                    "producer refused a record", topic=record.topic
                ) from exc

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for outstanding records; returns those left."""
        return int(self._producer.flush(timeout))

    def close(self, timeout: float) -> None:
        """Flush what can be flushed and stop the report thread."""
        self.flush(timeout)
        self._closed.set()
        self._poller.join(timeout=5)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _callback(
        self, family: str, commit_time_us: int | None, token: object, span: Span
    ) -> Callable[[KafkaError | None, Message], None]:
        commit_unix = None if commit_time_us is None else pgoutput.unix_seconds(commit_time_us)

        def report(err: KafkaError | None, _msg: Message) -> None:
            if err is None and commit_unix is not None:
                self._metrics.acknowledged(family, (time.time() - commit_unix) * 1000.0)
            if err is not None:
                span.set_attribute(spans.ERROR_TYPE, err.name())
                span.set_status(Status(StatusCode.ERROR, err.name()))
            span.end()
            self.reports.put(Report(token, err is None, None if err is None else err.str()))
            try:
                os.write(self._wake_w, b"!")
            except BlockingIOError:
                pass  # the pipe is full of wake-ups already

        return report

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = True
        log.warning("event=relay.kafka_error code=%s fatal=%s reason=%s",
                    err.name(), err.fatal(), err.str())

    def _poll(self) -> None:
        while not self._closed.is_set():
            # Short timeout: the loop returns as soon as a report is served, and checks
            # the closed flag at least this often.
            self._producer.poll(0.1)


def _publish_span(record: routing.Record) -> Span:
    """The span of one record's publication; ids and names only, never the payload."""
    headers = dict(record.headers)
    traceparent, tracestate = headers.get("traceparent"), headers.get("tracestate")
    attributes: dict[str, str] = {
        "messaging.system": "kafka", "messaging.operation.type": "publish",
        "messaging.destination.name": record.topic, "messaging.message.id": record.event_id,
        "agentledger.topic.family": record.family,
        "agentledger.event_type": headers.get("type", b"").decode(errors="replace")}
    if record.operation_id:
        attributes[spans.OPERATION_ID] = record.operation_id
    return tracer.start_span(
        "relay.publish", kind=SpanKind.PRODUCER, attributes=attributes,
        context=spans.context_from(traceparent.decode() if traceparent else None,
                                   tracestate.decode() if tracestate else None) or spans.ROOT)
