"""The relay measures commit→ack lag per topic family and the WAL its slot retains."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg2
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from agentledger.relay import metrics, options, stream
from tests.helpers import wait_until
from tests.integration.relay import support


def _points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [
        point
        for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        if m.name == name for point in m.data.data_points
    ]


def test_lag_histogram_has_bounded_labels_and_wal_gauge_is_reported(
    relay: support.Relay,
) -> None:
    reader = InMemoryMetricReader()
    opts = options.RelayOptions(
        database_url=relay.database_url, kafka_bootstrap=relay.bootstrap, slot=relay.slot,
        topic_namespace=relay.namespace, metrics_interval=0.2, idle_wait=0.1,
    )
    running = stream.Relay(opts, MeterProvider(metric_readers=[reader]))
    stop = threading.Event()
    thread = threading.Thread(target=running.run, args=(stop,), name="relay")
    thread.start()
    try:
        assert wait_until(lambda: running.sessions_started == 1, timeout=30)
        conn = psycopg2.connect(relay.database_url)
        with conn, conn.cursor() as cur:
            tenant = uuid.uuid4()
            for i in range(20):
                support.admit(cur, support.new_command(tenant, support.CONNECTORS[i % 3]))
            support.add_event(cur, tenant, "audit", 0)
        conn.close()
        assert wait_until(lambda: support.outbox_count(relay.database_url) == 0, timeout=30)

        lag = {tuple(sorted(p.attributes.items())): p for p in _points(reader, metrics.LAG)}
        assert lag[(("topic.family", "exec"),)].count == 20
        assert lag[(("topic.family", "audit"),)].count == 1
        assert 0 <= lag[(("topic.family", "exec"),)].max < 30_000  # milliseconds
        assert wait_until(lambda: bool(_points(reader, metrics.RETAINED_WAL)), timeout=10)
        wal = _points(reader, metrics.RETAINED_WAL)[0]
        assert wal.value >= 0 and dict(wal.attributes) == {"slot": relay.slot}
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
