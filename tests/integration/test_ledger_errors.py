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
from agentledger.testing import processes


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


async def test_a_ledger_that_refuses_connections_is_worth_retrying_not_poison() -> None:
    # Issue 19, found by the failover drill: while the primary was down, admission's
    # `pool.acquire()` (outside any transaction) raised ConnectionRefusedError, which the
    # handlers took for a bug: the proposal was dead-lettered and acked — lost — and so was an
    # executor's exec record. A ledger that cannot be reached is an outage: redeliver.
    port = processes.free_port()  # nothing listens there
    pool = await asyncpg.create_pool(f"postgresql://x:y@127.0.0.1:{port}/z", min_size=0, max_size=1)
    try:
        with pytest.raises(OSError) as refused:
            async with pool.acquire():
                pass
    finally:
        await pool.close()
    error = handling.classify(refused.value)
    assert isinstance(error, errors.StorageError) and error.retryable is True


@pytest.mark.parametrize("exc", [
    asyncpg.CannotConnectNowError("the database system is starting up"),  # 57P03, mid-failover
    asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    ConnectionResetError(104, "Connection reset by peer"),
])
def test_connection_failures_outside_a_transaction_are_worth_retrying(exc: BaseException) -> None:
    error = handling.classify(exc)
    assert isinstance(error, errors.StorageError) and error.retryable is True


def test_a_bug_is_still_a_bug() -> None:
    assert handling.classify(KeyError("x")).retryable is False
