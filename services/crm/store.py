"""The CRM's repository: the only module that talks to asyncpg.

Driver failures leave this module as ``errors.StorageError``. A mutation runs inside
``Store.mutation``: one transaction that checks the fencing token (if any), claims the
idempotency key (if any), applies the change, appends the effect and records the response,
so none exists without the others. A note — the write every dispatched command makes — does
all of that in ONE statement (``Store.create_note``, queries.sql ``create_note``): no
BEGIN/COMMIT round trips, its key claimed only together with the note it answers for.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeAlias

import asyncpg

from agentledger import sql
from agentledger.services.crm import errors, models

QUERIES = sql.load(Path(__file__).with_name("queries.sql"))
SCHEMA = Path(__file__).with_name("schema.sql")

# A CRM call holds a transaction for a few short statements; anything slower is a stuck
# lock or an overloaded database, better answered 503 than left hanging the caller.
STATEMENT_TIMEOUT = "5s"
# A transaction left open (a bug, a killed handler) must not keep key rows locked forever.
IDLE_IN_TRANSACTION_TIMEOUT = "10s"
# How long a request waits for a free connection before it gets a 503.
ACQUIRE_TIMEOUT_SECONDS = 10.0

# What a pool hands out; the same API as a connection.
_Conn: TypeAlias = "asyncpg.pool.PoolConnectionProxy[asyncpg.Record]"

_DRIVER_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except asyncpg.DataError as exc:  # SQLSTATE class 22: the same input fails every time
        raise errors.UnstorableInput() from exc
    except _DRIVER_ERRORS as exc:
        raise errors.StorageError() from exc


# Authenticated tokens kept in memory (a bounded map; the oldest sighting goes first).
PRINCIPALS_KEPT = 10_000


def token_digest(token: str) -> bytes:
    """What the CRM stores and looks up instead of the token itself."""
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class Principal:
    """Who a bearer token speaks for."""

    tenant_id: str
    scopes: frozenset[models.Scope]


@dataclass(frozen=True)
class Recorded:
    """The response first given for an idempotency key, kept byte for byte."""

    idempotency_key: str
    request_hash: bytes
    method: str
    path: str
    status: int
    headers: Mapping[str, str]
    body: bytes
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class Fence:
    """A write's fencing token and the key it fences (``Fencing-Token``, ``Fencing-Key``)."""

    key: str
    token: int


def _recorded(row: asyncpg.Record) -> Recorded:
    return Recorded(
        idempotency_key=row["idempotency_key"], request_hash=bytes(row["request_hash"]),
        method=row["method"], path=row["path"], status=row["status_code"],
        headers=row["response_headers"], body=bytes(row["response_body"]),
        created_at=row["created_at"], expires_at=row["expires_at"],
    )


@dataclass(frozen=True)
class NoteWrite:
    """A note request and the response it gets if applied (``Store.create_note``)."""

    note: models.Note
    key: str | None
    request_hash: bytes
    method: str
    path: str
    fence: Fence | None
    expected: frozenset[int] | None  # the revisions If-Match accepts; None: no If-Match
    status: int
    headers: Mapping[str, str]
    body: bytes


class Mutation:
    """One open transaction of a mutating request; obtained from ``Store.mutation``."""

    def __init__(self, conn: _Conn, tenant_id: str, key: str | None,
                 request_hash: bytes) -> None:
        self._conn = conn
        self._tenant_id = tenant_id
        self._key = key
        self._request_hash = request_hash
        self.recorded: Recorded | None = None
        """Set when the key was already used for this request: replay it, change nothing."""
        self.applied = False

    async def lock_customer(self, customer_id: str, *, shared: bool = False) -> models.Customer:
        """The customer, locked until commit so its revision cannot move underneath.

        ``shared``: for a write that does not change the revision (a note): concurrent notes
        on one customer do not wait for each other's commits; a contact update still waits.
        """
        query = QUERIES["share_customer" if shared else "lock_customer"]
        with _translated():
            row = await self._conn.fetchrow(query, self._tenant_id, customer_id)
        if row is None:
            raise errors.NotFound()
        return models.Customer.model_validate(dict(row))

    async def update_contact(self, customer_id: str, contact: models.Contact) -> models.Customer:
        with _translated():
            row = await self._conn.fetchrow(
                QUERIES["update_contact"], self._tenant_id, customer_id, contact.display_name,
                contact.email, contact.phone, contact.address_line1, contact.address_line2,
                contact.city, contact.postal_code, contact.country,
            )
        assert row is not None, "update_contact runs after lock_customer found the row"
        return models.Customer.model_validate(dict(row))

    async def insert_note(self, customer_id: str, body: str) -> models.Note:
        with _translated():
            row = await self._conn.fetchrow(
                QUERIES["insert_note"], uuid.uuid4(), self._tenant_id, customer_id, body
            )
        assert row is not None, "INSERT ... RETURNING returns the row"
        return models.Note.model_validate(dict(row))

    async def insert_refund(self, refund: models.RefundCreate) -> models.Refund:
        with _translated():
            row = await self._conn.fetchrow(
                QUERIES["insert_refund"], uuid.uuid4(), self._tenant_id, refund.customer_id,
                refund.invoice_id, refund.amount_cents, refund.currency, refund.reason,
            )
        assert row is not None, "INSERT ... RETURNING returns the row"
        return models.Refund.model_validate(dict(row))

    async def record(self, *, kind: str, customer_id: str, status: int,
                     headers: Mapping[str, str], body: bytes) -> None:
        """Append the effect and, under a key, the exact response to replay later."""
        with _translated():
            await self._conn.execute(
                QUERIES["insert_effect"], self._tenant_id, kind, customer_id, self._key,
                self._request_hash,
            )
            if self._key is not None:
                await self._conn.execute(
                    QUERIES["record_response"], self._tenant_id, self._key, status,
                    dict(headers), body,
                )
        self.applied = True


class Store:
    """The CRM's database, behind a connection pool."""

    def __init__(self, pool: asyncpg.Pool, *, retention_seconds: float) -> None:
        self._pool = pool
        self._principals: dict[bytes, Principal] = {}  # token digest → who it speaks for
        self._retention_seconds = retention_seconds

    @classmethod
    @asynccontextmanager
    async def open(cls, dsn: str, *, retention_seconds: float,
                   max_size: int) -> AsyncIterator[Store]:
        """Connect, apply ``schema.sql`` (idempotent), and close the pool on exit."""
        with _translated():
            pool = await asyncpg.create_pool(
                dsn, min_size=1, max_size=max_size, init=_init_connection, reset=_keep_session,
                server_settings={
                    "statement_timeout": STATEMENT_TIMEOUT,
                    "idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION_TIMEOUT,
                    "application_name": "agentledger-crm",
                },
            )
        try:
            store = cls(pool, retention_seconds=retention_seconds)
            await store._apply_schema()
            yield store
        finally:
            await pool.close()

    async def _apply_schema(self) -> None:
        with _translated():
            async with self._pool.acquire(timeout=ACQUIRE_TIMEOUT_SECONDS) as conn:
                async with conn.transaction():
                    await conn.execute(QUERIES["lock_schema"])
                    await conn.execute(SCHEMA.read_text(encoding="utf-8"))

    async def ping(self) -> None:
        with _translated():
            await self._pool.fetchval(QUERIES["ping"], timeout=ACQUIRE_TIMEOUT_SECONDS)

    async def authenticate(self, token: str) -> Principal | None:
        """Who the token speaks for; None for a token never issued.

        An issued token never changes (there is no revocation), so a found one is kept in
        memory: the read path's hot routes no longer query the database per request. Unknown
        tokens are not cached: one issued a moment later must work at once.
        """
        digest = token_digest(token)
        known = self._principals.get(digest)
        if known is not None:
            return known
        with _translated():
            row = await self._pool.fetchrow(QUERIES["find_token"], digest)
        if row is None:
            return None
        found = Principal(row["tenant_id"], frozenset(models.Scope(s) for s in row["scopes"]))
        if len(self._principals) >= PRINCIPALS_KEPT:
            self._principals.pop(next(iter(self._principals)))  # the oldest sighting
        self._principals[digest] = found
        return found

    async def issue_token(self, tenant_id: str, scopes: Sequence[models.Scope],
                          label: str = "") -> str:
        """A new token for ``tenant_id``; only its hash is stored: this is its one sighting."""
        token = "crm_" + secrets.token_urlsafe(32)
        with _translated():
            await self._pool.execute(
                QUERIES["insert_token"], token_digest(token), tenant_id,
                sorted({s.value for s in scopes}), label,
            )
        return token

    async def upsert_customer(self, tenant_id: str, customer_id: str,
                              contact: models.Contact) -> models.Customer:
        with _translated():
            row = await self._pool.fetchrow(
                QUERIES["upsert_customer"], tenant_id, customer_id, contact.display_name,
                contact.email, contact.phone, contact.address_line1, contact.address_line2,
                contact.city, contact.postal_code, contact.country,
            )
        assert row is not None, "an upsert returns the row"
        return models.Customer.model_validate(dict(row))

    async def get_customer(self, tenant_id: str, customer_id: str) -> models.Customer:
        with _translated():
            row = await self._pool.fetchrow(QUERIES["get_customer"], tenant_id, customer_id)
        if row is None:
            raise errors.NotFound()
        return models.Customer.model_validate(dict(row))

    async def customer_revisions(self, tenant_id: str, customer_ids: list[str]
                                 ) -> dict[str, int]:
        """The current revision of each of ``customer_ids`` that exists in the tenant."""
        with _translated():
            rows = await self._pool.fetch(QUERIES["customer_revisions"], tenant_id,
                                          customer_ids)
        return {row["customer_id"]: row["revision"] for row in rows}

    async def get_operation(self, tenant_id: str, key: str) -> Recorded | None:
        """The unexpired response recorded for ``key`` in this tenant."""
        with _translated():
            row = await self._pool.fetchrow(QUERIES["get_key"], tenant_id, key)
        return None if row is None else _recorded(row)

    async def list_effects(self, tenant_id: str) -> list[models.Effect]:
        with _translated():
            rows = await self._pool.fetch(QUERIES["list_effects"], tenant_id)
        return [models.Effect.model_validate({**dict(r), "request_hash": r["request_hash"].hex()})
                for r in rows]

    async def purge_expired_keys(self) -> int:
        with _translated():
            status = await self._pool.execute(QUERIES["purge_expired_keys"])
        return int(status.split()[-1])

    async def create_note(self, tenant_id: str, write: NoteWrite, *,
                          roll_back: bool = False) -> Recorded | None:
        """Apply ``write`` as one statement (queries.sql ``create_note``): None when it was
        applied (the caller answers ``write``'s response), or the record of an earlier use of
        its key by the same request (replay it).

        ``roll_back``: the statement runs in a transaction rolled back when it applied
        (the ``fail_before_commit`` fault), and ``errors.FaultInjected`` is raised.

        Raises:
            errors.StaleFencingToken, errors.KeyReused, errors.NotFound,
            errors.PreconditionFailed: as the multi-statement mutations would.
        """
        note, fence = write.note, write.fence
        args = (tenant_id, note.customer_id, note.note_id, note.body, note.created_at,
                write.key, write.request_hash, write.method, write.path,
                self._retention_seconds, fence.key if fence else None,
                fence.token if fence else None,
                None if write.expected is None else sorted(write.expected),
                dict(write.headers), write.body, write.status)
        with _translated():
            async with self._pool.acquire(timeout=ACQUIRE_TIMEOUT_SECONDS) as conn:
                if roll_back:
                    async with conn.transaction():
                        row = await conn.fetchrow(QUERIES["create_note"], *args)
                        if row is not None and row["applied"]:
                            raise errors.FaultInjected()
                else:
                    row = await conn.fetchrow(QUERIES["create_note"], *args)
                assert row is not None, "the statement always returns its verdict"
                verdict = row["verdict"]
                if verdict == "apply" and not row["applied"]:
                    # A concurrent request with this key committed after our snapshot.
                    again = await conn.fetchrow(QUERIES["get_key"], tenant_id, write.key)
                    if again is None:
                        raise errors.StorageError(
                            "idempotency key vanished during the claim; retry")
                    row, verdict = again, "replay"
        if verdict == "apply":
            return None
        if verdict == "stale":
            assert fence is not None
            raise errors.StaleFencingToken(
                f"fencing token {fence.token} is below {row['highest']}, already seen for this "
                "key; nothing was applied")
        if verdict == "not_found":
            raise errors.NotFound()
        if verdict == "stale_revision":
            raise errors.PreconditionFailed(f"the current revision is {row['revision']}")
        recorded = _recorded(row)
        if recorded.request_hash != write.request_hash:
            raise errors.KeyReused()
        return recorded

    @asynccontextmanager
    async def mutation(self, *, tenant_id: str, key: str | None, request_hash: bytes,
                       method: str, path: str, fence: Fence | None = None
                       ) -> AsyncIterator[Mutation]:
        """A transaction for one mutating request, committed when the block exits cleanly.

        With a ``fence``, its token is checked first: below the highest seen for its key,
        ``errors.StaleFencingToken`` is raised and nothing is applied (not even a replay: a
        stale writer learns nothing but that it is stale). Under a key, the key is claimed
        next: a concurrent request with the same key waits on the row until this one
        commits or rolls back. If the key was already used, the
        yielded ``Mutation.recorded`` holds the original response (same request) or
        ``errors.KeyReused`` is raised (different request). Raising in the block rolls
        everything back, including the claim.
        """
        with _translated():
            async with self._pool.acquire(timeout=ACQUIRE_TIMEOUT_SECONDS) as conn:
                async with conn.transaction():
                    mutation = Mutation(conn, tenant_id, key, request_hash)
                    if fence is not None:
                        await self._check_fence(conn, tenant_id, fence)
                    if key is not None:
                        mutation.recorded = await self._claim(conn, tenant_id, key,
                                                              request_hash, method, path)
                    yield mutation
                    if key is not None and mutation.recorded is None and not mutation.applied:
                        # A claimed key without its response would replay nothing: refuse.
                        raise RuntimeError("mutation claimed a key but recorded no response")

    async def advance_fence(self, tenant_id: str, fence: Fence) -> int:
        """Raise the fence of ``fence.key`` to at least ``fence.token`` and return the highest
        token seen for it, writing nothing else: from then on a lower token is refused."""
        with _translated():
            async with self._pool.acquire(timeout=ACQUIRE_TIMEOUT_SECONDS) as conn:
                return int(await conn.fetchval(QUERIES["raise_fence"], tenant_id, fence.key,
                                               fence.token))

    async def _check_fence(self, conn: _Conn, tenant_id: str, fence: Fence) -> None:
        highest = int(await conn.fetchval(QUERIES["raise_fence"], tenant_id, fence.key,
                                          fence.token))
        if highest > fence.token:
            raise errors.StaleFencingToken(
                f"fencing token {fence.token} is below {highest}, already seen for this key; "
                "nothing was applied")

    async def _claim(self, conn: _Conn, tenant_id: str, key: str,
                     request_hash: bytes, method: str, path: str) -> Recorded | None:
        claimed = await conn.fetchval(QUERIES["claim_key"], tenant_id, key, request_hash,
                                      method, path, self._retention_seconds)
        if claimed is not None:
            return None
        # now() is fixed for the transaction, so a key not claimable is still unexpired here.
        row = await conn.fetchrow(QUERIES["get_key"], tenant_id, key)
        if row is None:
            raise errors.StorageError("idempotency key vanished during the claim; retry")
        recorded = _recorded(row)
        if recorded.request_hash != request_hash:
            raise errors.KeyReused()
        return recorded


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset: no session state to undo (settings are the connection's startup
    parameters, locks and everything else transaction-scoped), so no reset round trip per
    request (asyncpg's default sends one on every release; it still rolls back an open
    transaction before calling this)."""
    del conn


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads,
                              schema="pg_catalog")

