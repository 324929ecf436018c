"""The relay measures commit→ack lag per topic family and the WAL its slot retains."""

from __future__ import annotations

import threading
import uuid
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from agentledger.relay import metrics, options, stream
from agentledger.testing import ledger
from agentledger.testing.polling import wait_until
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
        writer = ledger.Ledger(relay.database_url)
        try:
            with writer.transaction():
                tenant = uuid.uuid4()
                for i in range(20):
                    writer.admit(ledger.new_command(tenant, ledger.CONNECTORS[i % 3]))
                writer.add_event(tenant, "audit", 0)
        finally:
            writer.close()
        assert wait_until(lambda: ledger.outbox_count(relay.database_url) == 0, timeout=30)

        lag = {tuple(sorted(p.attributes.items())): p for p in _points(reader, metrics.LAG)}
        assert set(lag) == {(("topic.family", "exec"),), (("topic.family", "audit"),)}
        # One observation per acknowledged publish: 20 commands, and admission's
        # command.admitted event per command plus ours. A session the relay reset (it does on
        # a phantom acknowledgement, see publisher._phantom) republishes from the slot's
        # confirmed position, at least once, and each of those acknowledgements counts too.
        exact = running.sessions_started == 1
        exec_count = lag[(("topic.family", "exec"),)].count
        audit_count = lag[(("topic.family", "audit"),)].count
        if exact:
            assert (exec_count, audit_count) == (20, 21)
        else:
            assert exec_count >= 20 and audit_count >= 21, (running.sessions_started, exec_count)
        assert 0 <= lag[(("topic.family", "exec"),)].max < 30_000  # milliseconds
        assert wait_until(lambda: bool(_points(reader, metrics.RETAINED_WAL)), timeout=10)
        wal = _points(reader, metrics.RETAINED_WAL)[0]
        assert wal.value >= 0 and dict(wal.attributes) == {"slot": relay.slot}
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
