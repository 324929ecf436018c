"""Commands and events written the way the product writes them, for tests and benchmarks of
what reads the ledger (the relay above all).

A command goes through :func:`agentledger.ledger.repository.admit_in`, the statements
admission runs: the ledger row, its dispatch obligation in ``command_outbox`` and the
``command.admitted`` audit event, in a tenant-bound transaction. An event goes through
:func:`~agentledger.ledger.repository.append_event`. So what a relay test or the relay-lag
figure measures is the product's SQL, never a hand-written copy of it that could drift.
Only the policy (admission's checks, decision record and budget) is left out: a reader of
the outbox never sees it. :func:`new_row` is the row itself, for tests of the repository that
admit it their own way (replays, conflicts, row-level security).

:class:`Ledger` is the synchronous face (tests drive the relay from threads); :func:`admit`
and :func:`add_event` are the coroutines it runs.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import asyncpg
import psycopg2  # type: ignore[import-untyped]
from confluent_kafka.admin import AdminClient

from agentledger import canonical
from agentledger.ledger import repository
from agentledger.testing.polling import wait_until

CONNECTORS = ("crm", "billing", "shipping")

# The relay never reads a payload: a fixed ciphertext stands for one (no tenant key needed).
_CIPHERTEXT = b"\x00" * 16
# Far enough that nothing expires while a test runs (admission's own TTLs are shorter).
_COMMAND_TTL = timedelta(hours=1)
# Who asked, and the resource written: fixed, since no reader of a test row acts on them.
_PRINCIPAL, _TARGET = "user-1", "res-1"
# A row built without a trace still carries a well-formed one, as admission always writes one.
_TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"

_IDS = """
SELECT (SELECT id FROM command_outbox WHERE tenant_id = $1 AND operation_id = $2),
       (SELECT id FROM event_outbox
        WHERE tenant_id = $1 AND operation_id = $2 AND type = 'command.admitted')
"""
_EVENT_ID = "SELECT id FROM event_outbox WHERE tenant_id = $1 AND payload->>'probe' = $2"
_OUTBOX_COUNT = ("SELECT (SELECT count(*) FROM command_outbox)"
                 " + (SELECT count(*) FROM event_outbox)")


def traceparent() -> str:
    """A fresh W3C traceparent, sampled."""
    return f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"


@dataclass(frozen=True)
class Command:
    """One command to admit; once admitted, with the ids of the outbox rows written for it."""

    tenant: uuid.UUID
    operation: uuid.UUID
    connector: str
    traceparent: str = field(default_factory=traceparent)
    tracestate: str | None = None
    event_id: uuid.UUID | None = None  # its command_outbox row (the exec record's ``id``)
    audit_id: uuid.UUID | None = None  # its command.admitted audit event

    @property
    def key(self) -> str:
        """The exec record's key."""
        return f"{self.tenant}:{self.operation}"


def new_command(tenant: uuid.UUID, connector: str, tracestate: str | None = None) -> Command:
    """A command of ``tenant`` for ``connector`` under a new operation id."""
    return Command(tenant, uuid.uuid4(), connector, tracestate=tracestate)


def new_row(
    tenant_id: uuid.UUID | None = None,
    operation_id: uuid.UUID | None = None,
    *,
    body: str = "call back on Monday",
    connector: str = "crm",
    action: str | None = None,
    traceparent: str = _TRACEPARENT,
    tracestate: str | None = None,
) -> repository.NewCommand:
    """The row admission would write for one command, for tests that call the repository.

    Args:
        tenant_id: The tenant (a new one when not given).
        operation_id: The operation (a new one when not given).
        body: Part of the request hash: another body under the same operation conflicts.
        connector: The connector the command is for.
        action: The action (default ``<connector>.note.create``).
        traceparent: The W3C trace context carried to the outbox.
        tracestate: Its vendor state, if any.
    """
    tenant_id = tenant_id or uuid.uuid4()
    operation_id = operation_id or uuid.uuid4()
    action = action or f"{connector}.note.create"
    return repository.NewCommand(
        tenant_id=tenant_id, operation_id=operation_id,
        request_hash=canonical.request_hash(
            tenant_id=tenant_id, principal_id=_PRINCIPAL, action=action, target=_TARGET,
            arguments={"operation": str(operation_id), "body": body}, expected_revision=None),
        principal_id=_PRINCIPAL, action=action, connector=connector,
        resource_id=_TARGET, expected_revision=None, decision_id=uuid.uuid4(),
        policy_version="p1", allowlist_version="a1",
        expires_at=datetime.now(UTC) + _COMMAND_TTL,
        payload_ciphertext=_CIPHERTEXT, payload_key_version=1,
        traceparent=traceparent, tracestate=tracestate)


async def admit(conn: asyncpg.Connection, command: Command) -> Command:
    """Admit ``command`` (in the caller's transaction when one is open, else in its own).

    Returns:
        The command with the ids of its outbox row and audit event.
    """
    async with repository.transaction(conn, command.tenant) as tx:
        result = await repository.admit_in(tx, new_row(
            command.tenant, command.operation, connector=command.connector,
            traceparent=command.traceparent, tracestate=command.tracestate))
        assert result.status == "admitted", f"{command.key} was {result.status}"
        row = await tx.fetchrow(_IDS, command.tenant, command.operation)
    assert row is not None
    return replace(command, event_id=row[0], audit_id=row[1])


async def add_event(
    conn: asyncpg.Connection, tenant: uuid.UUID, kind: Literal["audit", "outcome"], seq: int
) -> uuid.UUID:
    """Write one audit or outcome event carrying ``seq`` in its payload; returns its id."""
    probe = str(uuid.uuid4())  # finds the row again: the statement returns no id
    async with repository.transaction(conn, tenant) as tx:
        await repository.append_event(
            tx, tenant_id=tenant, operation_id=None, family=kind, type=f"{kind}.recorded",
            payload={"tenant_id": str(tenant), "seq": seq, "probe": probe},
            traceparent=traceparent())
        found = await tx.fetchval(_EVENT_ID, tenant, probe)
    assert isinstance(found, uuid.UUID)
    return found


class Ledger:
    """A synchronous writer over one connection, for code that runs in threads.

    Each instance runs its own event loop; use it from one thread at a time (a commit may be
    handed to another thread while this one waits, as the visibility test does).
    """

    def __init__(self, url: str, *, connect_timeout: float = 10.0) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._conn: asyncpg.Connection = self._run(
                asyncpg.connect(url, timeout=connect_timeout))
        except BaseException:
            self._loop.close()
            raise

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    @property
    def pid(self) -> int:
        """The server process of the connection (to find it in ``pg_stat_activity``)."""
        return int(self._conn.get_server_pid())

    def begin(self) -> None:
        """Open a transaction: what follows commits together, or not at all."""
        self._run(self._conn.execute("BEGIN"))

    def commit(self) -> None:
        self._run(self._conn.execute("COMMIT"))

    def rollback(self) -> None:
        self._run(self._conn.execute("ROLLBACK"))

    @contextmanager
    def transaction(self) -> Iterator[Ledger]:
        """One transaction around the block; rolled back when it raises."""
        self.begin()
        try:
            yield self
        except BaseException:
            if not self._conn.is_closed():
                self.rollback()
            raise
        self.commit()

    def admit(self, command: Command) -> Command:
        """:func:`admit` on this connection."""
        admitted: Command = self._run(admit(self._conn, command))
        return admitted

    def add_event(self, tenant: uuid.UUID, kind: Literal["audit", "outcome"],
                  seq: int) -> uuid.UUID:
        """:func:`add_event` on this connection."""
        added: uuid.UUID = self._run(add_event(self._conn, tenant, kind, seq))
        return added

    def execute(self, sql: str, *args: object) -> None:
        self._run(self._conn.execute(sql, *args))

    def fetchval(self, sql: str, *args: object) -> Any:
        return self._run(self._conn.fetchval(sql, *args))

    def close(self) -> None:
        """Close the connection (terminated when the server is gone) and the loop."""
        try:
            self._run(self._conn.close(timeout=5))
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            self._conn.terminate()
        finally:
            self._loop.close()


def outbox_count(url: str) -> int:
    """Rows still in both outboxes (0 once the relay published and swept everything)."""
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(_OUTBOX_COUNT)
            row = cur.fetchone()
            assert row is not None
            return int(row[0])
    finally:
        conn.close()


def drop_slot(url: str, slot: str) -> None:
    """Drop a relay's replication slot once no process streams from it."""
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            def inactive() -> bool:
                cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
                row = cur.fetchone()
                return row is None or not row[0]

            assert wait_until(inactive, timeout=30), f"slot {slot} still active"
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                        " WHERE slot_name = %s", (slot,))
    finally:
        conn.close()


def delete_namespace_topics(admin: AdminClient, namespace: str) -> None:
    """Delete every topic a relay published under ``namespace`` (a test's or a bench's)."""
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(namespace)]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result(timeout=30)
