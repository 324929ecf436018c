"""Driver errors become one of three typed errors, in one place (repository.transaction):
refused for the role, refused for the data (both final), or worth retrying — on real PostgreSQL.

Issue 17: every PostgresError used to be a retryable StorageError, so a value Postgres can
never store (a NUL in text) was redelivered forever and stalled its partition.
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from agentledger import errors
from agentledger.kafka import handling
from agentledger.ledger import repository


@pytest.mark.parametrize(("statement", "args", "sqlstate"), [
    ("SELECT $1::text", ("a\x00b",), "22021"),                  # NUL in text
    ("SELECT $1::jsonb", ('{"a": "\\u0000"}',), "22P05"),        # NUL in jsonb
    ("SELECT $1::text", ("a\ud800",), "22000"),                 # a lone surrogate (client side)
    ("SELECT 1 / $1::int", (0,), "22012"),                      # division by zero
    ("CREATE TEMP TABLE t (x int CHECK (x > 0)); INSERT INTO t VALUES (-1)", (), "23514"),
])
async def test_data_and_constraint_errors_are_final(
    db: asyncpg.Connection, statement: str, args: tuple[object, ...], sqlstate: str
) -> None:
    with pytest.raises(errors.DataRejected) as refused:
        async with repository.transaction(db, uuid.uuid4()) as tx:
            if args:
                await tx.fetchval(statement, *args)
            else:
                await tx.execute(statement)  # two statements: the simple query protocol
    assert refused.value.details["sqlstate"] == sqlstate
    # The one mapping to broker actions: dead-letter and ack, never redeliver.
    assert handling.classify(refused.value).retryable is False


async def test_a_statement_timeout_is_worth_retrying(db: asyncpg.Connection) -> None:
    with pytest.raises(errors.StorageError) as failed:
        async with repository.transaction(db, uuid.uuid4(), timeout=0.2) as tx:
            await tx.execute("SELECT pg_sleep(5)")
    assert not isinstance(failed.value, errors.DataRejected | errors.AccessDenied)
    assert failed.value.retryable is True


async def test_a_refused_privilege_is_final_and_not_data(as_role: object) -> None:
    conn = await as_role("agentledger_relay")  # type: ignore[operator]
    with pytest.raises(errors.AccessDenied) as denied:
        async with repository.transaction(conn, None) as tx:
            await tx.fetchval("SELECT count(*) FROM agent_command")
    assert denied.value.retryable is False and denied.value.details["sqlstate"] == "42501"
