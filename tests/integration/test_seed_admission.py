"""The seed admission transaction admits once: one ledger row, one outbox row."""

from __future__ import annotations

import hashlib
import json
import uuid

import asyncpg

from agentledger import settings, sql

QUERIES = sql.load(settings.REPO_ROOT / "libs" / "agentledger" / "ledger" / "queries.sql")


async def _admit(conn: asyncpg.Connection, tenant: uuid.UUID, op: uuid.UUID, body: str) -> asyncpg.Record:
    command = json.dumps({"action": "crm.note.create", "payload": {"body": body}})
    request_hash = hashlib.sha256(command.encode()).digest()
    async with conn.transaction(isolation="read_committed"):
        await conn.execute("SET LOCAL statement_timeout = '5s'")
        await conn.execute(QUERIES["seed_admit"], tenant, op, request_hash, command)
        row = await conn.fetchrow(QUERIES["seed_recorded"], tenant, op)
    assert row is not None
    return row


async def test_seed_admission_twice_creates_one_command_and_one_obligation(
    db: asyncpg.Connection,
) -> None:
    tenant, op = uuid.uuid4(), uuid.uuid4()
    first = await _admit(db, tenant, op, "call back on Monday")
    second = await _admit(db, tenant, op, "call back on Monday")

    assert first["request_hash"] == second["request_hash"]
    assert second["state"] == "pending"
    assert await db.fetchval(
        "SELECT count(*) FROM agent_command WHERE tenant_id = $1 AND operation_id = $2", tenant, op
    ) == 1
    assert await db.fetchval(
        "SELECT count(*) FROM command_outbox WHERE tenant_id = $1 AND operation_id = $2", tenant, op
    ) == 1


async def test_different_payload_under_same_key_keeps_the_first(db: asyncpg.Connection) -> None:
    tenant, op = uuid.uuid4(), uuid.uuid4()
    first = await _admit(db, tenant, op, "original")
    second = await _admit(db, tenant, op, "tampered")
    # The stored hash is the first one: the caller sees the mismatch (a conflict), nothing changed.
    assert second["request_hash"] == first["request_hash"]
    stored = await db.fetchval(
        "SELECT command->'payload'->>'body' FROM agent_command WHERE tenant_id=$1 AND operation_id=$2",
        tenant, op,
    )
    assert stored == "original"
