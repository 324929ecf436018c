"""The seed admission transaction admits once: one ledger row, one outbox row.

This runs the seed's own schema (migration 0001 alone) and the seed's own statements, so the
reference design is checked as written; the production admission is tested in test_ledger_*.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import asyncpg
import pytest

from agentledger import migrations, settings

# The seed's statements, verbatim (seed §4).
SEED_ADMIT = """
WITH admitted AS (
  INSERT INTO agent_command (tenant_id, operation_id, request_hash, command, state)
  VALUES ($1, $2, $3, $4, 'pending')
  ON CONFLICT (tenant_id, operation_id) DO NOTHING
  RETURNING tenant_id, operation_id
)
INSERT INTO command_outbox (tenant_id, operation_id)
SELECT tenant_id, operation_id FROM admitted
"""
SEED_RECORDED = """
SELECT request_hash, state, provider_receipt
FROM agent_command
WHERE tenant_id = $1 AND operation_id = $2
"""


@pytest.fixture
async def db(make_database: Callable[[], str], tmp_path: Path) -> AsyncIterator[asyncpg.Connection]:
    """A database with the seed schema only (migration 0001)."""
    url = make_database()
    conn = await asyncpg.connect(url)
    await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    await conn.execute("DROP PUBLICATION IF EXISTS agentledger_outbox")
    seed_only = tmp_path / "seed"
    seed_only.mkdir()
    shutil.copy(settings.REPO_ROOT / "migrations" / "0001_seed_schema.sql", seed_only)
    await migrations.migrate(url, seed_only)
    try:
        yield conn
    finally:
        await conn.close()


async def _admit(conn: asyncpg.Connection, tenant: uuid.UUID, op: uuid.UUID, body: str) -> asyncpg.Record:
    command = json.dumps({"action": "crm.note.create", "payload": {"body": body}})
    request_hash = hashlib.sha256(command.encode()).digest()
    async with conn.transaction(isolation="read_committed"):
        await conn.execute("SET LOCAL statement_timeout = '5s'")
        await conn.execute(SEED_ADMIT, tenant, op, request_hash, command)
        row = await conn.fetchrow(SEED_RECORDED, tenant, op)
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
