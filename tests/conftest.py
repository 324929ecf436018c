"""Shared fixtures: the real stack, a fresh database per test module, fresh topics per test."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import asyncpg
import psycopg2
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

from agentledger import db as agentledger_db
from agentledger import migrations, settings
from agentledger.kafka import logs as kafka_logs
from agentledger.telemetry import metrics as telemetry_metrics
from tests import stack as stack_mod
from tests.helpers import Points
from tests.kafka_cluster import kafka_cluster  # noqa: F401 - a fixture, shared by tiers
from tests.private_stack import private_stack  # noqa: F401 - a fixture, shared by tiers

_TIER_SECONDS: dict[str, float] = {}
_TIER_TESTS: dict[str, int] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Setup and teardown included: a tier's module fixtures (whole pipelines) are its cost.
    parts = report.nodeid.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration
    if report.when == "call":
        _TIER_TESTS[tier] = _TIER_TESTS.get(tier, 0) + 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What each tier cost in this run (the README's table of tier costs comes from here)."""
    if _TIER_SECONDS:
        terminalreporter.write_sep("-", "seconds per tier")
        terminalreporter.write_line("  ".join(f"{tier} {_TIER_SECONDS[tier]:.0f} s ({_TIER_TESTS.get(tier, 0)})"
                                              for tier in sorted(_TIER_SECONDS)))


def _admin_exec(url: str, sql: str) -> None:
    conn = psycopg2.connect(url)
    conn.autocommit = True  # CREATE/DROP DATABASE cannot run inside a transaction
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


@pytest.fixture(scope="session")
def stack() -> Iterator[stack_mod.Stack]:
    with stack_mod.choose() as chosen:
        yield chosen


@pytest.fixture(scope="session")
def template_database(stack: stack_mod.Stack) -> Iterator[str]:
    """A database with every migration applied, copied for each test module."""
    name = f"al_tmpl_{uuid.uuid4().hex[:12]}"
    _admin_exec(stack.database_url, f'CREATE DATABASE "{name}"')
    url = agentledger_db.with_database(stack.database_url, name)
    asyncio.run(migrations.migrate(url, settings.REPO_ROOT / "migrations"))
    yield name
    _admin_exec(stack.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def make_database(stack: stack_mod.Stack, template_database: str) -> Iterator[Callable[[], str]]:
    """Factory: a fresh, migrated database (template copy); dropped at the end of the session."""
    created: list[str] = []

    def make() -> str:
        name = f"al_test_{uuid.uuid4().hex[:12]}"
        _admin_exec(stack.database_url, f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
        created.append(name)
        return agentledger_db.with_database(stack.database_url, name)

    yield make
    for name in created:
        _admin_exec(stack.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def database_url(make_database: Callable[[], str]) -> str:
    """A fresh migrated database for this test module: tests never see other modules' rows."""
    return make_database()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def kafka_admin(stack: stack_mod.Stack) -> AdminClient:
    # Lives past the stack's stop at the end of the run: its librdkafka lines go to logging,
    # never to the terminal after pytest's summary.
    return AdminClient({"bootstrap.servers": stack.kafka_bootstrap}, logger=kafka_logs.LIBRDKAFKA)


@pytest.fixture
def new_topic(kafka_admin: AdminClient, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """Factory: create a uniquely named topic (auto-creation is off on our brokers)."""
    made: list[str] = []

    def make(prefix: str = "t", partitions: int = 3) -> str:
        name = f"{prefix}.{request.node.name[:40]}.{uuid.uuid4().hex[:8]}".replace("[", "_").replace("]", "_")
        futures = kafka_admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        futures[name].result(timeout=30)
        made.append(name)
        return name

    yield make
    if made:
        for future in kafka_admin.delete_topics(made).values():
            future.result(timeout=30)


@pytest.fixture
def group_id(request: pytest.FixtureRequest) -> str:
    return f"g.{request.node.name[:40]}.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Points]:
    """``recorded("leases_expired")``: that counter of ``agentledger.telemetry.metrics`` on a
    private provider for this test, and a reader of its points by label set (the global
    provider can be set once per process, so a test cannot read it)."""

    def swap(attribute: str) -> Points:
        real: telemetry_metrics.Counter = getattr(telemetry_metrics, attribute)
        reader = InMemoryMetricReader()
        meter = MeterProvider(metric_readers=[reader], shutdown_on_exit=False).get_meter("t")
        monkeypatch.setattr(telemetry_metrics, attribute, telemetry_metrics.Counter(
            meter, real.name, unit=real.unit, description=real.description,
            labels=real.declared))

        def points() -> dict[tuple[tuple[str, Any], ...], int | float]:
            data = reader.get_metrics_data()
            return {tuple(sorted((p.attributes or {}).items())): p.value
                    for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics
                    for m in sm.metrics for p in m.data.data_points
                    if isinstance(p, NumberDataPoint)}

        return points

    return swap
