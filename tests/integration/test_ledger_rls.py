"""Tenant isolation is enforced by the database (R4.5), and each role can do only its job."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from agentledger import errors
from agentledger.ledger import repository
from agentledger.testing.ledger import new_row as new_command

ROLES = ("agentledger_admission", "agentledger_executor", "agentledger_reconciler",
         "agentledger_relay", "agentledger_maintenance", "agentledger_auditor")
TENANT_TABLES = ("agent_command", "command_outbox", "event_outbox", "command_attempt",
                 "tenant_data_key")




@pytest.fixture
async def admitted(db: asyncpg.Connection) -> repository.NewCommand:
    cmd = new_command()
    assert (await repository.admit(db, cmd)).status == "admitted"
    await db.execute(
        "INSERT INTO command_attempt (tenant_id, operation_id, fencing_generation, worker_id, kind) "
        "VALUES ($1, $2, 1, 'w1', 'dispatch')", cmd.tenant_id, cmd.operation_id,
    )
    return cmd


async def test_roles_are_least_privilege(db: asyncpg.Connection) -> None:
    rows = await db.fetch(
        "SELECT rolname, rolsuper, rolbypassrls, rolcreaterole, rolcreatedb, rolcanlogin "
        "FROM pg_roles WHERE rolname = ANY($1::text[])", list(ROLES),
    )
    assert {r["rolname"] for r in rows} == set(ROLES)
    for r in rows:
        assert not (r["rolsuper"] or r["rolbypassrls"] or r["rolcreaterole"] or r["rolcreatedb"]), r
    owners = await db.fetch(
        "SELECT tablename, tableowner FROM pg_tables WHERE tablename = ANY($1::text[])",
        list(TENANT_TABLES),
    )
    assert all(o["tableowner"] not in ROLES for o in owners)
    forced = await db.fetch(
        "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class "
        "WHERE relname = ANY($1::text[]) AND relkind = 'r'", list(TENANT_TABLES),
    )
    assert len(forced) == len(TENANT_TABLES)
    assert all(f["relrowsecurity"] and f["relforcerowsecurity"] for f in forced), forced


async def test_no_security_definer_function_runs_with_a_login_superuser_or_rls_bypassing_owner(
    db: asyncpg.Connection,
) -> None:
    # Issue 17 §7: the functions of 0004-0006 and 0010-0012 ran as the migrating role (a
    # superuser locally), bypassing row security and every grant.
    definers = await db.fetch(
        "SELECT p.oid::regprocedure::text AS fn, r.rolname, r.rolsuper, r.rolbypassrls, r.rolcanlogin "
        "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_roles r ON r.oid = p.proowner "
        "WHERE n.nspname = 'public' AND p.prosecdef")
    names = {d["fn"].split("(")[0] for d in definers}
    assert {"agentledger_needs_reconciliation_v3", "agentledger_stranded_pending_v2", "agentledger_expire_approvals",
            "agentledger_copy_audit_events_v3", "agentledger_budget_reserve_v2"} <= names, names
    for d in definers:
        assert not (d["rolsuper"] or d["rolbypassrls"] or d["rolcanlogin"]), dict(d)
        assert d["rolname"] in ("agentledger_sweeper", "agentledger_audit_writer",
                                "agentledger_budget_keeper", "agentledger_budget_counter"), dict(d)


async def test_the_sweepers_functions_still_serve_the_reconciler_across_tenants(
    db: asyncpg.Connection, admitted: repository.NewCommand,
) -> None:
    # Owned by a role under row security, the cross-tenant searches still see every tenant's
    # keys (their policies), and the audit copy still lands (its own owner). Rolled back: the
    # module's other tests count what the searches find.
    outer = db.transaction()
    await outer.start()
    try:
        await db.execute("UPDATE agent_command SET state = 'dispatching', lease_until = now() - interval '1 s', "
                         "claim_token = gen_random_uuid(), claimed_by = 'w1', fencing_generation = 1 "
                         "WHERE operation_id = $1", admitted.operation_id)
        await db.execute("SET ROLE agentledger_reconciler")
        found = await db.fetch("SELECT * FROM agentledger_needs_reconciliation_v3(100, ARRAY['crm'], 10)")
        stranded = await db.fetch("SELECT * FROM agentledger_stranded_pending_v2(100, interval '0 s')")
        expired = await db.fetch("SELECT * FROM agentledger_expire_approvals(100)")
        await db.execute("RESET ROLE")
        assert admitted.operation_id in {r["operation_id"] for r in found}
        assert isinstance(stranded, list) and isinstance(expired, list)
        count = "SELECT count(*) FROM audit_event WHERE operation_id = $1"
        before = await db.fetchval(count, admitted.operation_id)
        await db.execute("SET ROLE agentledger_executor")
        await db.execute("SELECT set_config('agentledger.tenant_id', $1, true)", str(admitted.tenant_id))
        await db.execute("INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, "
                         "payload) VALUES ($1, $2, 'audit', $3, 'test.copied', '{}')",
                         admitted.tenant_id, admitted.operation_id, str(admitted.tenant_id))
        await db.execute("RESET ROLE")
        assert await db.fetchval(count, admitted.operation_id) == before + 1
    finally:
        await outer.rollback()


@pytest.mark.parametrize("role", ["agentledger_admission", "agentledger_executor",
                                  "agentledger_reconciler", "agentledger_auditor"])
async def test_another_tenant_sees_nothing_and_no_tenant_sees_nothing(
    as_role: object, admitted: repository.NewCommand, role: str
) -> None:
    conn = await as_role(role)  # type: ignore[operator]
    other = uuid.uuid4()
    readable = {"agent_command", "command_attempt"} if role in (
        "agentledger_executor", "agentledger_reconciler", "agentledger_auditor") else {"agent_command"}
    for table in readable:
        async with repository.transaction(conn, admitted.tenant_id) as tx:
            assert await tx.fetchval(f"SELECT count(*) FROM {table}") >= 1, (role, table)
        async with repository.transaction(conn, other) as tx:
            assert await tx.fetchval(f"SELECT count(*) FROM {table}") == 0, (role, table)
        async with repository.transaction(conn, None) as tx:
            assert await tx.fetchval(f"SELECT count(*) FROM {table}") == 0, (role, table)


async def test_admission_cannot_write_for_another_tenant(
    as_role: object, admitted: repository.NewCommand
) -> None:
    conn = await as_role("agentledger_admission")  # type: ignore[operator]
    # Bound to tenant B, inserting a row that claims tenant A is refused by WITH CHECK.
    smuggled = new_command(admitted.tenant_id)
    with pytest.raises(errors.AccessDenied):
        async with repository.transaction(conn, uuid.uuid4()) as tx:
            await tx.execute(
                "INSERT INTO event_outbox (tenant_id, aggregatetype, aggregateid, type, payload) "
                "VALUES ($1, 'audit', 'x', 't', '{}')", smuggled.tenant_id,
            )
    # And admission through the repository binds the command's own tenant: that works.
    assert (await repository.admit(conn, smuggled)).status == "admitted"


async def test_admission_cannot_change_dispatch_state(
    as_role: object, admitted: repository.NewCommand
) -> None:
    conn = await as_role("agentledger_admission")  # type: ignore[operator]
    with pytest.raises(errors.AccessDenied):
        async with repository.transaction(conn, admitted.tenant_id) as tx:
            await tx.execute("UPDATE agent_command SET state = 'succeeded', provider_receipt='x'")
    with pytest.raises(errors.AccessDenied):
        async with repository.transaction(conn, admitted.tenant_id) as tx:
            await tx.execute("DELETE FROM agent_command")


@pytest.mark.parametrize("role", ["agentledger_executor", "agentledger_reconciler"])
async def test_executor_changes_state_but_never_payload_or_hash(
    as_role: object, admitted: repository.NewCommand, db: asyncpg.Connection, role: str
) -> None:
    conn = await as_role(role)  # type: ignore[operator]
    async with repository.transaction(conn, admitted.tenant_id) as tx:
        n = await tx.execute(
            "UPDATE agent_command SET state = 'dispatching', claim_token = gen_random_uuid(), "
            # A lease outliving the module: an expired one would compete in the reconciler
            # search test below, which reads the whole module's database.
            "lease_until = now() + interval '1 hour', fencing_generation = fencing_generation + 1 "
            "WHERE operation_id = $1", admitted.operation_id,
        )
    assert n == "UPDATE 1"
    for column, value in (("request_hash", "'\\x00'::bytea"), ("payload_ciphertext", "'\\x00'::bytea"),
                          ("principal_id", "'mallory'"), ("resource_id", "'cust-2'")):
        with pytest.raises(errors.AccessDenied):
            async with repository.transaction(conn, admitted.tenant_id) as tx:
                await tx.execute(f"UPDATE agent_command SET {column} = {value}")
    # A requeue may renew its own tenant's obligation, never another tenant's.
    with pytest.raises(errors.AccessDenied):
        async with repository.transaction(conn, uuid.uuid4()) as tx:
            await tx.execute("INSERT INTO command_outbox (tenant_id, operation_id, aggregatetype, "
                             "aggregateid, payload) VALUES ($1, $2, 'crm', 'x', '{}')",
                             admitted.tenant_id, admitted.operation_id)
    with pytest.raises(errors.AccessDenied):
        async with repository.transaction(conn, admitted.tenant_id) as tx:
            await tx.execute("INSERT INTO agent_command SELECT * FROM agent_command LIMIT 0")
    # Another tenant's executor transaction updates nothing.
    async with repository.transaction(conn, uuid.uuid4()) as tx:
        assert await tx.execute("UPDATE agent_command SET state = 'unknown'") == "UPDATE 0"
    row = await db.fetchrow("SELECT state, request_hash FROM agent_command WHERE operation_id=$1",
                            admitted.operation_id)
    assert row["state"] == "dispatching" and row["request_hash"] == admitted.request_hash


async def test_relay_reads_and_sweeps_outboxes_only(
    as_role: object, admitted: repository.NewCommand
) -> None:
    conn = await as_role("agentledger_relay")  # type: ignore[operator]
    async with repository.transaction(conn, None) as tx:
        assert await tx.fetchval("SELECT count(*) FROM command_outbox WHERE operation_id=$1",
                                 admitted.operation_id) == 1
    with pytest.raises(errors.AccessDenied):
        async with repository.transaction(conn, None) as tx:
            await tx.fetchval("SELECT count(*) FROM agent_command")
    with pytest.raises(errors.AccessDenied):
        async with repository.transaction(conn, None) as tx:
            await tx.execute("UPDATE command_outbox SET type = 'x'")
    async with repository.transaction(conn, None) as tx:
        assert await tx.execute("DELETE FROM command_outbox WHERE operation_id=$1",
                                admitted.operation_id) == "DELETE 1"


async def test_maintenance_can_only_purge_payloads(
    as_role: object, admitted: repository.NewCommand
) -> None:
    conn = await as_role("agentledger_maintenance")  # type: ignore[operator]
    with pytest.raises(errors.AccessDenied):
        async with repository.transaction(conn, None) as tx:
            await tx.execute("UPDATE agent_command SET state = 'succeeded'")
    with pytest.raises(errors.AccessDenied):
        async with repository.transaction(conn, None) as tx:
            await tx.execute("UPDATE agent_command SET request_hash = '\\x00'::bytea")


async def test_the_reconciler_search_serves_expired_leases_first_and_skips_operator_only_unknowns(
    db: asyncpg.Connection, as_role: object
) -> None:
    # Found by `make chaos N=200`: a pile of unknown refunds (no lookup) starved the search.
    from agentledger.ledger import dispatch

    waiting = [new_command(connector="billing", action="billing.refund.create") for _ in range(5)]
    for cmd in waiting:
        await repository.admit(db, cmd)
        await db.execute("UPDATE agent_command SET state = 'unknown', updated_at = now() - interval '1 hour' "
                         "WHERE operation_id = $1", cmd.operation_id)
    expired = new_command()
    await repository.admit(db, expired)
    await db.execute("UPDATE agent_command SET state = 'dispatching', claim_token = gen_random_uuid(), "
                     "lease_until = now() - interval '1 second' WHERE operation_id = $1", expired.operation_id)
    conn = await as_role("agentledger_reconciler")  # type: ignore[operator]
    first = await dispatch.needs_reconciliation(conn, limit=1, lookup_connectors=["crm"])
    assert [r["operation_id"] for r in first] == [expired.operation_id]
    every = await dispatch.needs_reconciliation(conn, limit=100, lookup_connectors=["crm"])
    assert not {c.operation_id for c in waiting} & {r["operation_id"] for r in every}
    with_lookup = await dispatch.needs_reconciliation(conn, limit=100, lookup_connectors=["crm", "billing"])
    assert {c.operation_id for c in waiting} <= {r["operation_id"] for r in with_lookup}
