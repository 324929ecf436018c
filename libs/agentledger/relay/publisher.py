"""The Kafka side of the relay: an idempotent producer and its delivery reports.

Delivery reports are served by a background thread so that the acknowledgement time (the
end of the lag measurement) does not depend on how often the streaming loop looks. The
thread only records the metric and collects the reports; the streaming loop applies them
to its checkpoint, so the bookkeeping stays single-threaded. Reports travel in batches: all
those one ``poll`` served go on the queue as one list, with one byte on the pipe that wakes
the loop (not a queue item and a write per record).

A success report is not taken on faith. An idempotent producer whose sequence numbers
were reset (librdkafka issue #3672: a partition forgotten and found again around a broker
restart) can have a new batch mistaken by the broker for a retry of an old one: the broker
answers "success" with the OLD batch's offsets and drops the new records. Within one
producer, acknowledged offsets of a partition only grow, so a report at or below the last
one seen for its partition is turned into a failure, and the producer is replaced (a new
producer id starts clean sequences); the session then republishes from the slot.

A success report WITHOUT an offset is not trusted either. librdkafka gives one when it
believes the broker already holds the record (an idempotent retry answered as a duplicate),
and it can be wrong: the first record produced to a freshly created topic's partition was
reported delivered with no offset and never written — the records after it got offsets 0
and 1, a full re-read did not find it, and the sweep had deleted its outbox row (the "lost
record", docs/operations.md; reproduced by tests/integration/relay/test_relay_backstop.py
in 1 of 50 runs). Such a report is a failure: the producer is replaced and the session
republishes from the slot, so a record that was in fact written is published twice (same
event id: consumers dedupe) instead of a record that was not being lost.
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
from agentledger.telemetry import spans, unrecorded

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
        trace_acks: log every success report with its event id, key, topic, partition and
            offset (``event=relay.acked``), so that a record later missing from its topic
            can be looked up at the exact offset Kafka acknowledged (a test setting: one
            line per record).
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        linger_ms: int,
        delivery_timeout_ms: int,
        relay_metrics: metrics.RelayMetrics,
        trace_acks: bool = False,
    ) -> None:
        self._trace_acks = trace_acks
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
        self.reports: queue.SimpleQueue[list[Report]] = queue.SimpleQueue()
        # Reports served and not handed over yet; callbacks run in the poller thread, or in
        # whichever thread flushes, so both sides take the lock.
        self._served: list[Report] = []
        self._served_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._fatal = False
        self._reset_reason: str | None = None
        # Highest acknowledged offset per (topic, partition) of the current producer, used
        # by that producer's reports only (it is replaced together with the producer).
        self._acked: dict[tuple[str, int], int] = {}
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

    def request_reset(self, reason: str) -> None:
        """Ask for a new producer at the next session start (see ``reset_if_needed``)."""
        self._reset_reason = self._reset_reason or reason

    def reset_if_needed(self) -> None:
        """Replace the producer after a fatal error, a phantom ack or a stall.

        The old producer's queued records are purged, not sent: the session that follows
        streams them again from the slot, so sending them too would only add duplicates.
        Their reports (failures) carry the abandoned session's epoch and are ignored.
        """
        reason = "fatal_error" if self._fatal else self._reset_reason
        if reason is None:
            return
        log.warning("event=relay.producer_reset reason=%s", reason)
        old = self._producer
        old.purge(in_queue=True, in_flight=True, blocking=False)
        self._producer = Producer(self._config)
        self._acked = {}
        self._fatal = False
        self._reset_reason = None
        old.flush(0)  # serves the purged records' reports; the old producer is then dropped
        self._hand_over()

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
        on_delivery = self._callback(record, commit_time_us, token, span)
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
        left = int(self._producer.flush(timeout))
        self._hand_over()
        return left

    def _hand_over(self) -> None:
        """Queue the reports served so far as one batch, and wake the loop once."""
        with self._served_lock:
            if not self._served:
                return
            served, self._served = self._served, []
        self.reports.put(served)
        try:
            os.write(self._wake_w, b"!")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already

    def close(self, timeout: float) -> None:
        """Flush what can be flushed and stop the report thread."""
        self.flush(timeout)
        self._closed.set()
        self._poller.join(timeout=5)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _callback(
        self, record: routing.Record, commit_time_us: int | None, token: object, span: Span
    ) -> Callable[[KafkaError | None, Message], None]:
        family = record.family
        commit_unix = None if commit_time_us is None else pgoutput.unix_seconds(commit_time_us)
        acked = self._acked  # this producer's offsets, even if the report is served later

        def report(err: KafkaError | None, msg: Message) -> None:
            reason = err.str() if err is not None else self._phantom(acked, msg)
            ok = reason is None
            if ok and self._trace_acks:
                log.info("event=relay.acked id=%s key=%s topic=%s partition=%s offset=%s",
                         record.event_id, record.key.decode(errors="replace"), msg.topic(),
                         msg.partition(), msg.offset())
            if ok and commit_unix is not None:
                self._metrics.acknowledged(family, (time.time() - commit_unix) * 1000.0)
            if not ok:
                name = err.name() if err is not None else "PHANTOM_ACK"
                span.set_attribute(spans.ERROR_TYPE, name)
                span.set_status(Status(StatusCode.ERROR, name))
            span.end()
            with self._served_lock:
                self._served.append(Report(token, ok, reason))

        return report

    def _phantom(self, acked: dict[tuple[str, int], int], msg: Message) -> str | None:
        reason = phantom_ack(acked, msg.topic(), msg.partition(), msg.offset())
        if reason is not None:
            self.request_reset("phantom_ack")
            log.error("event=relay.phantom_ack topic=%s partition=%s reason=%s",
                      msg.topic(), msg.partition(), reason)
        return reason

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = True
        log.warning("event=relay.kafka_error code=%s fatal=%s reason=%s",
                    err.name(), err.fatal(), err.str())

    def _poll(self) -> None:
        while not self._closed.is_set():
            # Short timeout: the loop returns as soon as reports are served, and checks
            # the closed flag at least this often.
            if self._producer.poll(0.1):
                self._hand_over()


def phantom_ack(
    acked: dict[tuple[str, int], int], topic: str | None, partition: int | None,
    offset: int | None,
) -> str | None:
    """Why a success report cannot be trusted (module doc), or ``None`` when it can.

    ``acked`` holds the highest offset acknowledged so far per partition, for one producer;
    a trusted report raises it. A report without a partition or an offset is never trusted:
    nothing says where, or whether, the record was written.
    """
    if topic is None or partition is None or offset is None or offset < 0:
        return (f"acknowledged without an offset ({offset}): whether the record was written "
                "cannot be checked")
    last = acked.get((topic, partition))
    if last is not None and offset <= last:
        return f"acknowledged at offset {offset}, not after {last}: the record may be lost"
    acked[(topic, partition)] = offset
    return None


def _publish_span(record: routing.Record) -> Span:
    """The span of one record's publication; ids and names only, never the payload.

    Nothing reads this span's context (the record carries admission's, unchanged): when no
    span is recorded (``telemetry.unrecorded``) it is not built at all.
    """
    if unrecorded.in_use():
        return trace.INVALID_SPAN
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
