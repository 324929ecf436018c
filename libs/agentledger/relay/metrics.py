"""The relay's OpenTelemetry metrics; labels are bounded (topic family only, R8.3)."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

LAG = "agentledger.relay.lag"
RETAINED_WAL = "agentledger.relay.slot.retained_wal"
PUBLISHED = "agentledger.relay.published"
BACKSTOP = "agentledger.relay.backstop.published"


class RelayMetrics:
    """Lag histogram, published counter and the WAL-retained gauge.

    Args:
        provider: the meter provider; the global one when ``None``.
        slot: the slot name, the gauge's only label (one per relay: bounded).
    """

    def __init__(self, provider: MeterProvider | None, slot: str) -> None:
        meter = (provider or metrics.get_meter_provider()).get_meter("agentledger.relay")
        self._slot = slot
        self.retained_wal_bytes: int | None = None
        self._lag = meter.create_histogram(
            LAG, unit="ms", description="Commit of the outbox row to Kafka acknowledgement."
        )
        self._published = meter.create_counter(
            PUBLISHED, unit="{record}", description="Records acknowledged by Kafka."
        )
        self._backstop = meter.create_counter(
            BACKSTOP, unit="{record}",
            description="Outbox rows published by the backstop scan, not the stream "
                        "(reason: pre_slot, or stale: a row the stream should have carried).")
        meter.create_observable_gauge(
            RETAINED_WAL,
            callbacks=[self._observe_wal],
            unit="By",
            description="WAL the replication slot keeps (pg_current_wal_lsn - restart_lsn).",
        )

    def acknowledged(self, family: str, lag_ms: float) -> None:
        """One record acknowledged ``lag_ms`` after its transaction committed."""
        attributes = {"topic.family": family}
        self._lag.record(max(lag_ms, 0.0), attributes)
        self._published.add(1, attributes)

    def backstop_published(self, rows: int, reason: str) -> None:
        """``rows`` outbox rows handed to the producer by the backstop, for ``reason``."""
        if rows:
            self._backstop.add(rows, {"reason": reason})

    def _observe_wal(self, _options: CallbackOptions) -> Iterable[Observation]:
        # The streaming loop refreshes the value; the exporter thread never touches the DB.
        if self.retained_wal_bytes is None:
            return []
        return [Observation(self.retained_wal_bytes, {"slot": self._slot})]
