"""The `unknown` backlog the alerts read (issue 23), counted on a real ledger.

Commands are admitted in two tenants, put in `unknown` for two connectors (as the owner, with
`dispatched_at` set back to arrange an age), and one reconciler sweep — acting as
agentledger_reconciler, under row security — counts them across tenants through
``agentledger_unknown_backlog_v1`` (SECURITY DEFINER, migration 0023). The gauges are read
through an in-memory reader; no other service role may call the function.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

from agentledger import db as agentledger_db
from agentledger import errors
from agentledger.connectors import base
from agentledger.executor import reconciler
from agentledger.ledger import dispatch, repository
from agentledger.telemetry import metrics as telemetry_metrics
from agentledger.testing.ledger import new_row as new_command
from tests.integration.conftest import AsRole

# Connectors without lookup: the sweep leaves their `unknown` commands to an operator, so it
# changes none of the rows this test arranged and only counts them.
_NO_LOOKUP = base.Contract("none", call_timeout_s=5.0)


_ACTIONS = {"crm": "crm.note.create", "billing": "billing.refund.create"}


@dataclass
class _Connector:
    name: str
    contract: base.Contract = _NO_LOOKUP


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> InMemoryMetricReader:
    """The module's gauges, rebuilt on a private provider whose reader the test collects."""
    found = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[found], shutdown_on_exit=False).get_meter("t")
    monkeypatch.setattr(telemetry_metrics, "unknown_backlog",
                        telemetry_metrics.UnknownBacklog(meter))
    return found


@pytest.fixture
async def reconciler_pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await agentledger_db.create_pool(database_url, role="agentledger_reconciler", size=2)
    yield pool
    await pool.close()


def _gauge(reader: InMemoryMetricReader, name: str) -> dict[str, float]:
    data = reader.get_metrics_data()
    found = [m for rm in (data.resource_metrics if data else ())
             for sm in rm.scope_metrics for m in sm.metrics if m.name == name]
    return {str((p.attributes or {})["connector"]): p.value
            for m in found for p in m.data.data_points if isinstance(p, NumberDataPoint)}


async def _unknown(db: asyncpg.Connection, tenant_id: uuid.UUID, connector: str,
                   age_s: float) -> uuid.UUID:
    """A command of ``connector`` admitted for ``tenant_id``, first sent ``age_s`` seconds ago
    and `unknown` since a moment ago (a take-over rewrote ``updated_at``: the age ignores it)."""
    cmd = new_command(tenant_id, connector=connector, action=_ACTIONS[connector])
    assert (await repository.admit(db, cmd)).status == "admitted"
    await db.execute(
        "UPDATE agent_command SET state = 'unknown', fencing_generation = 1, "
        "dispatched_at = now() - make_interval(secs => $2), updated_at = now() "
        "WHERE operation_id = $1",
        cmd.operation_id, age_s)
    return cmd.operation_id


async def test_one_sweep_counts_unknown_commands_per_connector_across_tenants(
    db: asyncpg.Connection, reconciler_pool: asyncpg.Pool, reader: InMemoryMetricReader,
) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    # The oldest doubt of each connector is in a different tenant from its newest.
    await _unknown(db, a, "crm", 7200.0)
    await _unknown(db, b, "crm", 60.0)
    await _unknown(db, b, "crm", 5.0)
    await _unknown(db, b, "billing", 5 * 3600.0)
    await _unknown(db, a, "billing", 10.0)
    settled = await _unknown(db, a, "billing", 9 * 3600.0)
    await db.execute("UPDATE agent_command SET state = 'failed', finished_at = now() "
                     "WHERE operation_id = $1", settled)  # no longer `unknown`: not counted
    # A pending command is not `unknown` either.
    assert (await repository.admit(db, new_command(a, connector="crm"))).status == "admitted"

    worker = reconciler.Reconciler(
        pool=reconciler_pool, credentials=base.Credentials("lookup"), worker_id="reconciler-1",
        connectors={n: _Connector(n) for n in ("crm", "billing", "email")})  # type: ignore[misc]
    assert _gauge(reader, "agentledger.commands.unknown") == {}  # nothing counted yet
    done = await worker.sweep()
    assert not done  # nothing to recover: operator-only `unknown`s are skipped, not touched

    assert _gauge(reader, "agentledger.commands.unknown") == {"crm": 3, "billing": 2, "email": 0}
    ages = _gauge(reader, "agentledger.commands.unknown.oldest_age")
    assert set(ages) == {"crm", "billing", "email"}
    assert 7200.0 <= ages["crm"] < 7200.0 + 600
    assert 5 * 3600.0 <= ages["billing"] < 5 * 3600.0 + 600
    assert ages["email"] == 0.0

    # Settled by an operator: the next sweep reports the connector at 0, so its alert resolves.
    await db.execute("UPDATE agent_command SET state = 'failed', finished_at = now() "
                     "WHERE state = 'unknown' AND connector = 'billing'")
    await worker.sweep()
    assert _gauge(reader, "agentledger.commands.unknown") == {"crm": 3, "billing": 0, "email": 0}
    assert _gauge(reader, "agentledger.commands.unknown.oldest_age")["billing"] == 0.0


@pytest.mark.parametrize("role", ["agentledger_admission", "agentledger_executor",
                                  "agentledger_relay", "agentledger_maintenance",
                                  "agentledger_auditor"])
async def test_no_other_service_role_may_count_the_backlog(as_role: AsRole, role: str) -> None:
    conn = await as_role(role)
    with pytest.raises(errors.AccessDenied):
        await dispatch.unknown_backlog(conn)
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
        await conn.fetch("SELECT * FROM agentledger_unknown_backlog_v1()")


async def test_the_function_is_a_definer_owned_by_the_sweeper_and_granted_to_the_reconciler(
    db: asyncpg.Connection,
) -> None:
    row = await db.fetchrow(
        "SELECT p.prosecdef, r.rolname AS owner, p.proconfig FROM pg_proc p "
        "JOIN pg_roles r ON r.oid = p.proowner WHERE p.oid = 'agentledger_unknown_backlog_v1()'"
        "::regprocedure")
    assert row is not None
    assert row["prosecdef"] and row["owner"] == "agentledger_sweeper"
    assert row["proconfig"] == ["search_path=pg_catalog, public"]
    callers = await db.fetch(
        "SELECT grantee::regrole::text AS role FROM pg_proc p, aclexplode(p.proacl) "
        "WHERE p.oid = 'agentledger_unknown_backlog_v1()'::regprocedure "
        "AND privilege_type = 'EXECUTE'")
    assert {c["role"] for c in callers} == {"agentledger_sweeper", "agentledger_reconciler"}
