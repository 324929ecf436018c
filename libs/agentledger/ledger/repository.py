"""The only code that runs ledger SQL. Driver errors are translated here, nowhere else.

Every tenant-scoped statement runs inside :func:`transaction`, which binds the tenant for
row-level security (``set_config(..., true)``: this transaction only), bounds the transaction
in time, and rolls back on any error (SPEC R4.2, R4.5).
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal
from uuid import UUID

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from agentledger import errors, faults, sql

# A plain connection or one borrowed from a pool: every function here takes either.
Conn = asyncpg.Connection | PoolConnectionProxy
Q = sql.load(Path(__file__).with_name("queries.sql"))

# Admission and claims are a handful of short statements; anything slower is a stuck lock
# or an overloaded server, and holding the transaction open longer only makes it worse.
DEFAULT_TX_TIMEOUT_S = 5.0
# How long data sent to the server may stay unacknowledged before the kernel drops the
# connection (TCP_USER_TIMEOUT), and when an idle one is probed (keepalive). On a silent
# network (a partition, a host gone behind NAT) a statement — and the ROLLBACK that follows
# the client-side timeout above — otherwise waits until the kernel stops retransmitting
# (~15 min), holding its claim's task, an in-flight slot and a pooled connection
# (tests/chaos/test_partitions.py). The server's kernel acknowledges in milliseconds even
# while a statement or a synchronous commit waits, so 10 s never cuts a healthy connection.
TCP_USER_TIMEOUT_S = 10.0
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 10, 5, 3


# SQLSTATE classes the data itself causes: 22 data exception (e.g. 22P05, a NUL in text or
# jsonb), 23 integrity constraint violation. Every other failure (connection, timeout,
# serialization, resources) may pass when tried again.
DATA_SQLSTATE_CLASSES: Final = frozenset({"22", "23"})


def storage_error(exc: asyncpg.PostgresError) -> errors.StorageError:
    """The one translation of a driver error: refused for this role, refused for its data
    (both final), or a failure worth retrying."""
    sqlstate = exc.sqlstate or ""
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return errors.AccessDenied(str(exc), sqlstate=sqlstate)
    if sqlstate[:2] in DATA_SQLSTATE_CLASSES:
        return errors.DataRejected(str(exc), sqlstate=sqlstate)
    return errors.StorageError(str(exc), sqlstate=sqlstate)


def driver_error(exc: BaseException) -> errors.StorageError | None:
    """The storage error a driver or network failure raised outside ``transaction`` stands
    for, or None when ``exc`` is neither: acquiring a pooled connection while the server is
    down, restarting or being failed over (refused, reset, "the database system is starting
    up"). Worth retrying, unless a privilege or the data itself was refused.
    """
    if isinstance(exc, asyncpg.PostgresError):
        return storage_error(exc)
    if isinstance(exc, OSError | asyncpg.InterfaceError | asyncpg.InternalClientError):
        # (InternalClientError: the server ended the session in the middle of the protocol.)
        return errors.StorageError(f"ledger unreachable: {exc!r}")
    return None


AdmitStatus = Literal["admitted", "replayed", "conflict"]


async def keep_session(conn: asyncpg.Connection) -> None:
    """A pool's ``reset``: nothing to undo, so no round trip when a connection goes back.

    asyncpg's default reset sends ``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET
    ALL`` on EVERY release — a round trip (and server work) per acquire, which was ~10 % of a
    service's CPU on the hot path. Nothing of ours leaves session state on a pooled
    connection: every setting is transaction-local (``set_config(..., true)`` in
    :func:`transaction`), no session advisory lock, cursor or LISTEN is taken on one, and the
    pool's ``init`` sets the role once (``RESET ALL`` never reset it). asyncpg still rolls back
    a transaction left open before calling this.
    """
    del conn


def bound_silence(conn: asyncpg.Connection) -> None:
    """Make the kernel drop ``conn`` once the server stops acknowledging (a silent network),
    instead of after its retransmission limit. For a pool's ``init``; a no-op on a Unix
    socket or where the options do not exist.

    asyncpg has no keepalive or user-timeout setting (MagicStack/asyncpg#606): the options go
    on its transport's socket, as its maintainers suggest there.
    """
    transport = getattr(conn, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                        int(TCP_USER_TIMEOUT_S * 1000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)


@asynccontextmanager
async def transaction(
    conn: Conn, tenant_id: UUID | None, *, timeout: float = DEFAULT_TX_TIMEOUT_S
) -> AsyncIterator[Conn]:
    """A READ COMMITTED transaction bound to one tenant, with a timeout; rolls back on error.

    Args:
        conn: a connection (from a pool or not); the caller owns it.
        tenant_id: the tenant for row-level security; ``None`` runs with no tenant bound
            (only cross-tenant roles such as retention or the relay see rows then).
        timeout: seconds for the transaction's statements, enforced client-side and as
            the server's statement timeout. Not for its COMMIT: a commit waiting for a
            synchronous standby must wait. Cancelling that wait does not undo the commit,
            it makes it visible on the primary alone, where a failover loses it after the
            relay may have published it (issue 19).

    Raises:
        AccessDenied: privileges or row security refused a statement.
        DataRejected: the data itself was refused (SQLSTATE class 22 or 23); not retryable.
        StorageError: any other database failure (retryable).
    """
    timeout_ms = f"{int(timeout * 1000)}ms"
    join = _JOINED.get()
    try:
        async with asyncio.timeout(timeout) as bound:
            if join is not None and join.conn is conn:
                # Inside a group commit (``groupcommit``): the group's transaction is this
                # one. A failure marks the group, which then rolls back and runs each of its
                # units alone — what a savepoint would give, without its round trips.
                if join.tenant_id != tenant_id:
                    join.failed = True
                    raise errors.StorageError("a grouped transaction is bound to another "
                                              "tenant; the group runs its units alone")
                try:
                    yield conn
                except BaseException:
                    join.failed = True
                    raise
                bound.reschedule(None)
                return
            if conn.is_in_transaction():
                # Nested in a transaction: a savepoint, like asyncpg's nested transactions.
                await conn.execute("SAVEPOINT agentledger_nested")
                try:
                    await conn.execute(Q["bind_transaction"], timeout_ms,
                                       None if tenant_id is None else str(tenant_id))
                    yield conn
                except BaseException:
                    await _rollback(conn, "ROLLBACK TO SAVEPOINT agentledger_nested")
                    raise
                await conn.execute("RELEASE SAVEPOINT agentledger_nested")
                bound.reschedule(None)
                return
            # BEGIN and both settings in one round trip (simple query protocol, so nothing
            # is bound: the values are an integer and a parsed UUID, safe to inline), where
            # asyncpg's transaction() would send BEGIN alone first. Hand-written because
            # asyncpg has no way to pipeline the two.
            try:
                await conn.execute(_begin_sql(timeout_ms, tenant_id))
                yield conn
            except BaseException:
                await _rollback(conn)
                raise
            # The COMMIT may wait for the synchronous standby: no client-side cancel from
            # here. (The server's statement timeout does not interrupt that wait;
            # tests/integration/test_ledger_syncrep.py checks both.)
            bound.reschedule(None)
            await conn.execute("COMMIT")
    except asyncpg.PostgresError as exc:
        raise storage_error(exc) from exc
    except (TimeoutError, OSError, asyncpg.InterfaceError) as exc:
        raise errors.StorageError(f"ledger transaction failed: {exc!r}") from exc
    except asyncpg.InternalClientError as exc:
        # The server ended the session under a statement (an administrator's or a
        # failover's termination, noticed mid-protocol): the connection is unusable.
        conn.terminate()
        raise errors.StorageError(f"ledger connection lost: {exc!r}") from exc


_ROLLBACK_TIMEOUT_S = 2.0


@dataclass
class Join:
    """A group commit's transaction, which :func:`transaction` on its connection joins."""

    conn: Conn
    tenant_id: UUID | None
    failed: bool = False  # a joined transaction failed: the group must not commit


_JOINED: contextvars.ContextVar[Join | None] = contextvars.ContextVar(
    "agentledger_joined_transaction", default=None)


def join(group: Join) -> None:
    """From now on in this context, :func:`transaction` on ``group.conn`` for its tenant
    joins the transaction that connection is in instead of opening one (``groupcommit``:
    called in a context made for one unit of the group)."""
    _JOINED.set(group)


def _begin_sql(timeout_ms: str, tenant_id: UUID | None) -> str:
    settings = f"set_config('statement_timeout', '{timeout_ms}', true)"
    if tenant_id is not None:
        # UUID(str(...)) both validates and normalises: only hex digits and dashes remain.
        settings += f", set_config('agentledger.tenant_id', '{UUID(str(tenant_id))}', true)"
    return f"BEGIN ISOLATION LEVEL READ COMMITTED; SELECT {settings}"


async def _rollback(conn: Conn, statement: str = "ROLLBACK") -> None:
    """Roll back after a failure inside :func:`transaction`; a connection that cannot is
    broken, and is closed (the server rolls back when the session ends; the pool replaces
    it), so the original error is the one raised."""
    if conn.is_closed():
        return
    try:
        # Bounded: the failure may be the network itself (a partition), and the caller's
        # deadline has already been spent.
        async with asyncio.timeout(_ROLLBACK_TIMEOUT_S):
            await conn.execute(statement)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError,
            OSError, TimeoutError):
        conn.terminate()


@dataclass(frozen=True, slots=True, kw_only=True)
class NewCommand:
    """The command's fields, defined once: what admission persists for one approved command
    (the payload already encrypted), what an approval request holds until it is decided
    (``approvals.NewApproval.command``), and what approving the request admits.

    A plain slots dataclass, not a pydantic model: admission builds one per command on its
    hot path from fields it has already validated.
    """

    tenant_id: UUID
    operation_id: UUID
    request_hash: bytes
    principal_id: str
    action: str
    connector: str
    resource_id: str
    expected_revision: str | None
    decision_id: UUID
    policy_version: str
    allowlist_version: str
    expires_at: datetime
    payload_ciphertext: bytes
    payload_key_version: int
    traceparent: str | None = None
    tracestate: str | None = None

    @classmethod
    def of(cls, source: object, **changes: Any) -> NewCommand:
        """The command ``source`` holds under the same attribute names (e.g. a stored
        approval request), with ``changes`` applied."""
        kept = {name: getattr(source, name)
                for name in cls.__dataclass_fields__ if name not in changes}
        return cls(**kept, **changes)


@dataclass(frozen=True)
class Recorded:
    """What the ledger holds for an operation id: enough to answer a replay."""

    request_hash: bytes
    state: str
    provider_receipt: str | None
    outcome_reason: str | None
    action: str
    connector: str
    resource_id: str
    created_at: datetime
    finished_at: datetime | None
    payload_purged: bool

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | asyncpg.Record) -> Recorded:
        return cls(**{f: row[f] for f in cls.__dataclass_fields__})


@dataclass(frozen=True)
class AdmitResult:
    """The outcome of one admission attempt."""

    status: AdmitStatus
    recorded: Recorded


async def append_event(
    conn: Conn,
    *,
    tenant_id: UUID,
    operation_id: UUID | None,
    family: Literal["audit", "outcome"],
    type: str,
    payload: Mapping[str, Any],
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> None:
    """Write an audit or outcome event into the outbox, inside the caller's transaction.

    An event of an operation names it in its payload (what the topic's record carries):
    analytics on the audit topic tie every event to its operation without the ledger.
    """
    if operation_id is not None and "operation_id" not in payload:
        payload = {"operation_id": str(operation_id), **payload}
    await conn.execute(
        Q["append_event"], tenant_id, operation_id, family, type, event_json(payload),
        traceparent, tracestate,
    )


def event_json(payload: Mapping[str, Any]) -> str:
    """An event's payload as the outbox stores it (for statements that write events)."""
    return json.dumps(payload, default=str, separators=(",", ":"))


async def admit_in(
    tx: Conn, cmd: NewCommand, *, audit: Mapping[str, Any] | None = None
) -> AdmitResult:
    """The admission statements, inside the caller's tenant-bound transaction.

    For callers that must admit atomically with other writes (an approval's decision);
    everyone else calls :func:`admit`.
    """
    inserted = await tx.fetchval(
        Q["admit_command"],
        cmd.tenant_id, cmd.operation_id, cmd.request_hash, cmd.principal_id, cmd.action,
        cmd.connector, cmd.resource_id, cmd.expected_revision, cmd.decision_id,
        cmd.policy_version, cmd.allowlist_version, cmd.expires_at, cmd.payload_ciphertext,
        cmd.payload_key_version, cmd.traceparent, cmd.tracestate,
    )
    row = await tx.fetchrow(Q["recorded_command"], cmd.tenant_id, cmd.operation_id)
    if row is None:  # impossible unless row security hides our own tenant's row
        raise errors.StorageError("admitted command is not visible to its own tenant")
    recorded = Recorded.from_row(row)
    status: AdmitStatus
    if inserted:
        status = "admitted"
    elif hmac.compare_digest(recorded.request_hash, cmd.request_hash):
        status = "replayed"
    else:
        status = "conflict"
    await append_event(
        tx, tenant_id=cmd.tenant_id, operation_id=cmd.operation_id, family="audit",
        type=f"command.{status}",
        payload=_admission_audit(
            cmd.operation_id, cmd.principal_id, cmd.action, cmd.connector, cmd.request_hash,
            recorded, {"decision_id": str(cmd.decision_id), "policy_version": cmd.policy_version,
                       "allowlist_version": cmd.allowlist_version, **(audit or {})}),
        traceparent=cmd.traceparent, tracestate=cmd.tracestate,
    )
    return AdmitResult(status, recorded)


async def admit_allowed(
    tx: Conn, cmd: NewCommand, *, workflow_id: str | None, tool_call_limit: int | None,
    audit: Mapping[str, Any], decision_reasons: str, decision_reason: str,
    charges: str | None = None,
) -> AdmitResult | BudgetRefused | None:
    """Admission's allowed path in ONE statement, inside the caller's tenant-bound
    transaction (issue 41): spend one tool call of ``workflow_id``'s budget (opened with
    ``tool_call_limit`` by its first use; None: unbudgeted), admit, write the dispatch
    obligation, the ``command.admitted`` audit event and the allow decision
    (``decision_reasons``: its JSON list of policy ids).

    Returns the admission, or None when this statement admitted nothing — the key is already
    recorded (a replay or a conflict), or the budget has no room: the caller then takes the
    general path (:func:`admit_in` and the budget's own refusal), which answers those cases.
    A spend that raced a first admission of the same key is given back first.

    ``charges`` (JSON, :func:`agentledger.budgets.rules.charges_json`) are the operator's
    budgets this command falls under, reserved in the same statement, all or none: a budget
    without room answers :class:`BudgetRefused` naming it (its ``budget.exhausted`` audit
    event is written; the tool call is given back).
    """
    budgeted = workflow_id is not None and tool_call_limit is not None
    row = await tx.fetchrow(
        Q["admit_allowed"],
        cmd.tenant_id, cmd.operation_id, cmd.request_hash, cmd.principal_id, cmd.action,
        cmd.connector, cmd.resource_id, cmd.expected_revision, cmd.decision_id,
        cmd.policy_version, cmd.allowlist_version, cmd.expires_at, cmd.payload_ciphertext,
        cmd.payload_key_version, cmd.traceparent, cmd.tracestate,
        workflow_id if budgeted else None, tool_call_limit if budgeted else None,
        admitted_audit_json(cmd, audit), decision_reasons, decision_reason, charges)
    assert row is not None
    if row["created_at"] is not None:
        return admitted_now(cmd, row["created_at"])
    if row["spent"]:
        await tx.execute(Q["give_back_tool_call"], cmd.tenant_id, workflow_id)
    if row["refused_by"] is not None:
        return BudgetRefused(row["refused_by"])
    return None


def admitted_audit_json(cmd: NewCommand, audit: Mapping[str, Any]) -> str:
    """The ``command.admitted`` audit payload of a first admission by the one-statement paths
    (``admit_allowed``, ``admitbatch``): what :func:`admit_in` writes for it, as JSON."""
    return event_json({
        "operation_id": str(cmd.operation_id), "principal_id": cmd.principal_id,
        "action": cmd.action, "connector": cmd.connector,
        "submitted_hash": cmd.request_hash.hex(), "recorded_hash": cmd.request_hash.hex(),
        "state": "pending", "decision_id": str(cmd.decision_id),
        "policy_version": cmd.policy_version, "allowlist_version": cmd.allowlist_version,
        **audit})


def admitted_now(cmd: NewCommand, created_at: datetime) -> AdmitResult:
    """The result of a first admission a one-statement path wrote (no read-back needed)."""
    return AdmitResult("admitted", Recorded(
        request_hash=cmd.request_hash, state="pending", provider_receipt=None,
        outcome_reason=None, action=cmd.action, connector=cmd.connector,
        resource_id=cmd.resource_id, created_at=created_at, finished_at=None,
        payload_purged=False))


@dataclass(frozen=True, slots=True)
class BudgetRefused:
    """An operator's budget had no room for the command (issue 42); nothing was admitted."""

    budget: str


async def charge_budgets(tx: Conn, tenant_id: UUID, operation_id: UUID,
                         charges: str) -> BudgetRefused | None:
    """Reserve the command's budget charges in the caller's transaction (the general path),
    all or none; None when charged now or before (a resubmission is counted once)."""
    refused = await tx.fetchval(Q["charge_budgets"], tenant_id, operation_id, charges)
    return BudgetRefused(refused) if refused is not None else None


def _admission_audit(
    operation_id: UUID, principal_id: str, action: str, connector: str, submitted: bytes,
    recorded: Recorded, more: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The ``command.admitted`` / ``replayed`` / ``conflict`` audit payload: both hashes and
    the recorded state, so an auditor sees what was submitted against what the ledger holds."""
    return {"operation_id": str(operation_id), "principal_id": principal_id, "action": action,
            "connector": connector, "submitted_hash": submitted.hex(),
            "recorded_hash": recorded.request_hash.hex(), "state": recorded.state, **(more or {})}


async def admit(
    conn: Conn, cmd: NewCommand, *, audit: Mapping[str, Any] | None = None,
    timeout: float = DEFAULT_TX_TIMEOUT_S,
    also: Callable[[Conn, AdmitResult], Awaitable[None]] | None = None,
) -> AdmitResult:
    """Admit a command once (SPEC R4.1-R4.3).

    One transaction inserts the ledger row and, only for the first admission, the outbox row;
    then the stored hash is compared with the submitted one: same → replay (nothing created),
    different → conflict (nothing changed). Every outcome is audited in the same transaction.

    Args:
        conn: a connection whose role may admit (``agentledger_admission`` or an owner).
        cmd: the command to admit.
        audit: extra, non-sensitive fields for the audit event (no payload, no prompt).
        also: more writes for the same transaction (e.g. the policy decision), given the
            transaction and the result.
    """
    async with transaction(conn, cmd.tenant_id, timeout=timeout) as tx:
        result = await admit_in(tx, cmd, audit=audit)
        if also is not None:
            await also(tx, result)
        await faults.point("admission.before_commit")
    return result


async def recorded(conn: Conn, tenant_id: UUID, operation_id: UUID) -> Recorded:
    """The recorded state of one command.

    Raises:
        CommandNotFound: no such command in this tenant (or in any tenant the caller can see).
    """
    async with transaction(conn, tenant_id) as tx:
        row = await tx.fetchrow(Q["recorded_command"], tenant_id, operation_id)
    if row is None:
        raise errors.CommandNotFound(operation_id=str(operation_id))
    return Recorded.from_row(row)


async def replay_in(
    tx: Conn, *, tenant_id: UUID, operation_id: UUID, principal_id: str, request_hash: bytes,
    audit: Mapping[str, Any] | None = None,
) -> AdmitResult | None:
    """A proposal answered from the ledger alone, inside the caller's tenant-bound transaction.

    ``None`` when ``operation_id`` holds no command (nothing is written). Otherwise the same
    outcome :func:`admit_in` gives a second admission — ``replayed`` when the hashes match,
    ``conflict`` when they differ — with the same audit event, and nothing else changed.
    """
    row = await tx.fetchrow(Q["recorded_command"], tenant_id, operation_id)
    if row is None:
        return None
    recorded = Recorded.from_row(row)
    status: AdmitStatus = (
        "replayed" if hmac.compare_digest(recorded.request_hash, request_hash) else "conflict")
    await append_event(
        tx, tenant_id=tenant_id, operation_id=operation_id, family="audit",
        type=f"command.{status}",
        payload=_admission_audit(operation_id, principal_id, recorded.action,
                                 recorded.connector, request_hash, recorded, audit),
    )
    return AdmitResult(status, recorded)


async def is_recorded(tx: Conn, tenant_id: UUID, operation_id: UUID) -> bool:
    """Whether the ledger holds a command for this key, inside the caller's tenant-bound
    transaction."""
    return await tx.fetchrow(Q["recorded_command"], tenant_id, operation_id) is not None


async def admitted_hash(conn: Conn, tenant_id: UUID, operation_id: UUID) -> bytes | None:
    """The request hash of the command ``operation_id`` holds, ``None`` if it holds none.

    Through ``agentledger_admitted_hash`` (0021), the only access ingress' role has: no
    transaction or tenant setting is needed, and nothing but the digest leaves the ledger.
    """
    found = await conn.fetchval(Q["admitted_hash"], tenant_id, operation_id)
    return bytes(found) if found is not None else None


@dataclass(frozen=True)
class StoredKey:
    """A tenant's wrapped data key as stored."""

    version: int
    wrapped: bytes
    master_key_id: str


async def data_key(
    conn: Conn, tenant_id: UUID, make_wrapped: Callable[[], tuple[bytes, str]],
    *, version: int | None = None,
) -> StoredKey:
    """The tenant's wrapped data key: the current one, or ``version`` when given.

    The current key is created as version 1 on first use (``make_wrapped`` returns the wrapped
    key and the id of the master key that wrapped it). Concurrent first uses are safe: the
    first insert wins and everyone reads the winner's key.

    Raises:
        DecryptionFailed: ``version`` was asked for and does not exist for this tenant.
    """
    async with transaction(conn, tenant_id) as tx:
        if version is not None:
            row = await tx.fetchrow(Q["data_key"], tenant_id, version)
            if row is None:
                raise errors.DecryptionFailed("no data key of that version for this tenant")
        else:
            row = await tx.fetchrow(Q["latest_data_key"], tenant_id)
            if row is None:
                wrapped, master_key_id = make_wrapped()
                await tx.execute(Q["insert_data_key"], tenant_id, 1, wrapped, master_key_id)
                row = await tx.fetchrow(Q["latest_data_key"], tenant_id)
    assert row is not None
    return StoredKey(int(row["key_version"]), bytes(row["wrapped_key"]), row["master_key_id"])


async def xid_visible(conn: Conn, xid: int) -> bool:
    """Whether transaction ``xid`` (32-bit) is visible to other sessions yet."""
    return bool(await conn.fetchval(Q["xid_visible"], xid))


async def load_command(
    conn: Conn, tenant_id: UUID, operation_id: UUID
) -> asyncpg.Record:
    """The command exactly as admission stored it (R1.6).

    Raises:
        CommandNotFound: no such command visible to this tenant.
    """
    async with transaction(conn, tenant_id) as tx:
        row = await load_command_in(tx, tenant_id, operation_id)
    if row is None:
        raise errors.CommandNotFound(operation_id=str(operation_id))
    return row


async def load_command_in(tx: Conn, tenant_id: UUID, operation_id: UUID
                          ) -> asyncpg.Record | None:
    """:func:`load_command` inside the caller's tenant-bound transaction; None when absent."""
    row: asyncpg.Record | None = await tx.fetchrow(Q["load_command"], tenant_id, operation_id)
    return row


async def purge_payloads(
    conn: Conn, *, older_than_s: float, batch: int = 500
) -> list[tuple[UUID, UUID]]:
    """Purge payloads of commands terminal for longer than ``older_than_s``, and the payload
    and evidence ciphertexts of approval requests decided longer ago (R3.6).

    Runs across tenants (role ``agentledger_maintenance``); returns the keys of every purged
    row (a command and its approval request may both appear).
    """
    async with transaction(conn, None, timeout=30) as tx:
        rows = await tx.fetch(Q["purge_payloads"], older_than_s, batch)
        rows += await tx.fetch(Q["purge_approval_payloads"], older_than_s, batch)
    return [(r["tenant_id"], r["operation_id"]) for r in rows]
