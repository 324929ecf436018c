"""The `unknown` backlog gauges (issue 23): their callbacks report the reconciler's last count.

Each test builds the gauges on a private meter provider with an in-memory reader (the global
provider can be set once per process). The database is a stand-in here;
tests/integration/test_unknown_backlog.py counts real commands across tenants.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

from agentledger.connectors import base
from agentledger.executor import reconciler
from agentledger.ledger import dispatch
from agentledger.telemetry import metrics as telemetry_metrics

COMMANDS = "agentledger.commands.unknown"
OLDEST_AGE = "agentledger.commands.unknown.oldest_age"

Read = Callable[[str], dict[str, float]]


class _Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _gauges(clock: _Clock | None = None) -> tuple[telemetry_metrics.UnknownBacklog, Read]:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader], shutdown_on_exit=False).get_meter("t")
    gauges = telemetry_metrics.UnknownBacklog(meter, clock=clock or _Clock())

    def read(name: str) -> dict[str, float]:
        data = reader.get_metrics_data()
        found = [m for rm in (data.resource_metrics if data else ())
                 for sm in rm.scope_metrics for m in sm.metrics if m.name == name]
        points = [p for m in found for p in m.data.data_points if isinstance(p, NumberDataPoint)]
        assert all(set(p.attributes or {}) == {"connector"} for p in points), points
        return {str((p.attributes or {})["connector"]): p.value for p in points}

    return gauges, read


def test_nothing_is_reported_before_the_first_count() -> None:
    _, read = _gauges()
    assert read(COMMANDS) == {}
    assert read(OLDEST_AGE) == {}


def test_the_callbacks_report_the_last_snapshot_and_zero_for_a_served_connector() -> None:
    gauges, read = _gauges()
    gauges.update([dispatch.UnknownBacklog("billing", 3, 7200.5)], served=["crm", "billing"])
    assert read(COMMANDS) == {"billing": 3, "crm": 0}
    assert read(OLDEST_AGE) == {"billing": 7200.5, "crm": 0.0}
    # The backlog settled, and a connector nobody serves turned up: the snapshot is replaced.
    gauges.update([dispatch.UnknownBacklog("email", 1, 12.0)], served=["crm", "billing"])
    assert read(COMMANDS) == {"billing": 0, "crm": 0, "email": 1}
    assert read(OLDEST_AGE) == {"billing": 0.0, "crm": 0.0, "email": 12.0}
    gauges.update([], served=["crm", "billing"])
    assert read(COMMANDS) == {"billing": 0, "crm": 0}


def test_the_age_keeps_growing_between_counts_and_while_sweeps_fail() -> None:
    """The snapshot holds when the oldest was first sent, not its age then: a reconciler whose
    sweeps stopped (database away, a crash loop) cannot freeze an old `unknown` below the
    alert's threshold."""
    clock = _Clock()
    gauges, read = _gauges(clock)
    gauges.update([dispatch.UnknownBacklog("crm", 2, 3600.0)], served=["crm"])
    assert read(OLDEST_AGE) == {"crm": 3600.0}
    clock.now += 4 * 3600  # four hours of failed sweeps: no update
    assert read(OLDEST_AGE) == {"crm": 5 * 3600.0}
    assert read(COMMANDS) == {"crm": 2}


def test_a_connector_name_that_is_not_a_bounded_name_is_reported_as_other() -> None:
    gauges, read = _gauges()
    gauges.update([dispatch.UnknownBacklog("Tenant-42:legacy", 2, 50.0),
                   dispatch.UnknownBacklog("x" * 80, 1, 90.0)], served=[])
    assert read(COMMANDS) == {"other": 3}
    assert read(OLDEST_AGE) == {"other": 90.0}


class _Pool:
    """Counts acquisitions: the callbacks must never reach the database."""

    def __init__(self) -> None:
        self.acquired = 0

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[object]:
        self.acquired += 1
        yield object()


@dataclass
class _Connector:
    contract: base.Contract
    name: str


async def test_the_reconciler_refreshes_the_snapshot_and_the_callbacks_only_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gauges, read = _gauges()
    monkeypatch.setattr(telemetry_metrics, "unknown_backlog", gauges)
    counted = [[dispatch.UnknownBacklog("billing", 4, 300.0)]]

    async def unknown_backlog(_conn: Any) -> list[dispatch.UnknownBacklog]:
        return counted.pop(0)

    monkeypatch.setattr(dispatch, "unknown_backlog", unknown_backlog)
    pool = _Pool()
    contract = base.Contract("none", call_timeout_s=5.0)
    worker = reconciler.Reconciler(
        pool=pool, credentials=base.Credentials("lookup"), worker_id="recovery",  # type: ignore[arg-type]
        connectors={n: _Connector(contract, n) for n in ("crm", "billing")})  # type: ignore[misc]
    await worker.count_unknown()
    assert pool.acquired == 1 and counted == []
    for _ in range(3):  # every export reads the snapshot; none asks the database again
        assert read(COMMANDS) == {"billing": 4, "crm": 0}
        assert read(OLDEST_AGE) == {"billing": 300.0, "crm": 0.0}
    assert pool.acquired == 1


def test_the_gauges_have_the_names_and_units_the_alerts_use() -> None:
    # deploy/prometheus/alerts.yaml reads agentledger_commands_unknown and
    # agentledger_commands_unknown_oldest_age_seconds (tests/deploy checks the translation).
    assert isinstance(telemetry_metrics.unknown_backlog, telemetry_metrics.UnknownBacklog)
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader], shutdown_on_exit=False).get_meter("t")
    telemetry_metrics.UnknownBacklog(meter).update([], served=["crm"])
    data = reader.get_metrics_data()
    assert data is not None
    units = {m.name: m.unit for rm in data.resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics}
    assert units == {COMMANDS: "{command}", OLDEST_AGE: "s"}
