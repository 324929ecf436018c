"""Admit once (R3, R4): concurrency, replay, conflict, tenant scoping — on real PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import asyncpg
import pytest

from agentledger.ledger import repository
from agentledger.testing.ledger import new_row as new_command


async def _count(db: asyncpg.Connection, table: str, tenant: uuid.UUID, op: uuid.UUID) -> int:
    return int(await db.fetchval(
        f"SELECT count(*) FROM {table} WHERE tenant_id = $1 AND operation_id = $2", tenant, op
    ))


async def test_32_concurrent_admissions_make_one_command_and_one_obligation(
    database_url: str, db: asyncpg.Connection
) -> None:
    cmd = new_command()
    pool = await asyncpg.create_pool(database_url, min_size=32, max_size=32)
    try:
        async def one() -> repository.AdmitResult:
            async with pool.acquire() as conn:
                return await repository.admit(conn, cmd)

        results = await asyncio.gather(*(one() for _ in range(32)))
    finally:
        await pool.close()

    statuses = sorted(r.status for r in results)
    assert statuses.count("admitted") == 1
    assert statuses.count("replayed") == 31
    assert await _count(db, "agent_command", cmd.tenant_id, cmd.operation_id) == 1
    assert await _count(db, "command_outbox", cmd.tenant_id, cmd.operation_id) == 1
    audit = await db.fetch(
        "SELECT type FROM event_outbox WHERE tenant_id=$1 AND operation_id=$2 AND aggregatetype='audit'",
        cmd.tenant_id, cmd.operation_id,
    )
    assert sorted(r["type"] for r in audit) == ["command.admitted"] + ["command.replayed"] * 31


async def test_same_key_different_payload_is_a_conflict_and_changes_nothing(
    db: asyncpg.Connection,
) -> None:
    first = new_command(body="original")
    assert (await repository.admit(db, first)).status == "admitted"
    before = dict(await db.fetchrow(
        "SELECT * FROM agent_command WHERE tenant_id=$1 AND operation_id=$2",
        first.tenant_id, first.operation_id,
    ))
    tampered = dataclasses.replace(
        new_command(first.tenant_id, first.operation_id, body="tampered"),
        payload_ciphertext=b"other ciphertext",
    )
    result = await repository.admit(db, tampered)
    assert result.status == "conflict"
    assert result.recorded.request_hash == first.request_hash
    after = dict(await db.fetchrow(
        "SELECT * FROM agent_command WHERE tenant_id=$1 AND operation_id=$2",
        first.tenant_id, first.operation_id,
    ))
    assert after == before
    assert await _count(db, "command_outbox", first.tenant_id, first.operation_id) == 1
    conflict = await db.fetchrow(
        "SELECT payload FROM event_outbox WHERE operation_id=$1 AND type='command.conflict'",
        first.operation_id,
    )
    assert conflict is not None  # the conflict is audited


async def test_same_operation_id_in_two_tenants_is_two_commands(db: asyncpg.Connection) -> None:
    op = uuid.uuid4()
    a, b = new_command(uuid.uuid4(), op), new_command(uuid.uuid4(), op, body="other")
    assert (await repository.admit(db, a)).status == "admitted"
    assert (await repository.admit(db, b)).status == "admitted"
    assert await db.fetchval("SELECT count(*) FROM agent_command WHERE operation_id=$1", op) == 2
    assert await db.fetchval("SELECT count(*) FROM command_outbox WHERE operation_id=$1", op) == 2


async def test_terminal_command_replay_returns_the_recorded_result(db: asyncpg.Connection) -> None:
    cmd = new_command()
    await repository.admit(db, cmd)
    await db.execute(
        "UPDATE agent_command SET state='succeeded', provider_receipt='note-77', finished_at=now() "
        "WHERE tenant_id=$1 AND operation_id=$2", cmd.tenant_id, cmd.operation_id,
    )
    await db.execute("DELETE FROM command_outbox WHERE operation_id=$1", cmd.operation_id)  # relayed
    result = await repository.admit(db, cmd)
    assert result.status == "replayed"
    assert (result.recorded.state, result.recorded.provider_receipt) == ("succeeded", "note-77")
    assert await _count(db, "command_outbox", cmd.tenant_id, cmd.operation_id) == 0


async def test_outbox_row_has_debezium_columns_and_no_command(db: asyncpg.Connection) -> None:
    cmd = new_command(connector="billing", action="billing.refund.create")
    await repository.admit(db, cmd)
    row = await db.fetchrow("SELECT * FROM command_outbox WHERE operation_id=$1", cmd.operation_id)
    assert row["aggregatetype"] == "billing"
    assert row["aggregateid"] == f"{cmd.tenant_id}:{cmd.operation_id}"
    assert row["type"] == "command.admitted"
    assert row["traceparent"] == cmd.traceparent
    import json
    assert json.loads(row["payload"]) == {
        "tenant_id": str(cmd.tenant_id), "operation_id": str(cmd.operation_id),
        "type": "command.admitted",
    }


async def test_transaction_rolls_back_on_error(db: asyncpg.Connection) -> None:
    cmd = new_command()
    with pytest.raises(RuntimeError):
        async with repository.transaction(db, cmd.tenant_id) as tx:
            await tx.execute(
                "INSERT INTO event_outbox (tenant_id, aggregatetype, aggregateid, type, payload) "
                "VALUES ($1, 'audit', 'x', 'probe', '{}')", cmd.tenant_id,
            )
            raise RuntimeError("boom")
    assert await db.fetchval("SELECT count(*) FROM event_outbox WHERE type='probe'") == 0
