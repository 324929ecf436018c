"""The relay's database access: slot, publication, sweep and the WAL-retained probe.

The only relay module that touches the driver (psycopg2: psycopg 3 has no replication
protocol, and one driver for the relay is simpler than two). Driver errors are translated
here: connection-level failures become the retryable :class:`ReplicationLost`.

Production connects as a LOGIN user granted ``agentledger_relay`` (REPLICATION, SELECT and
DELETE on the outboxes); tests may use the superuser.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import psycopg2.errors  # type: ignore[import-untyped]
import psycopg2.extras  # type: ignore[import-untyped]

from agentledger import errors, sql
from agentledger.ledger import repository as ledger_repository
from agentledger.relay import routing

log = logging.getLogger(__name__)
_QUERIES = sql.load(Path(__file__).with_name("queries.sql"))
_SWEEP = {
    routing.COMMAND_TABLE: _QUERIES["sweep_command_outbox"],
    routing.EVENT_TABLE: _QUERIES["sweep_event_outbox"],
}
OUTBOX_TABLES = frozenset(_SWEEP)
_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")


@contextmanager
def translated(action: str) -> Iterator[None]:
    """Turn driver errors raised by ``action`` into relay errors."""
    try:
        yield
    except errors.RelayError:
        raise
    except psycopg2.Error as exc:
        raise errors.ReplicationLost(f"{action} failed: {type(exc).__name__}") from exc


# The bound the asyncpg pools get from ``ledger.repository.bound_silence``, through libpq's
# own options: on a silent network (a partition) a sweep, a control query or the replication
# stream fails after ~10 s instead of waiting out the kernel's retransmissions (~15 min).
SILENCE: dict[str, int] = {
    "keepalives": 1, "keepalives_idle": ledger_repository.KEEPALIVE_IDLE_S,
    "keepalives_interval": ledger_repository.KEEPALIVE_INTERVAL_S,
    "keepalives_count": ledger_repository.KEEPALIVE_PROBES,
    "tcp_user_timeout": int(ledger_repository.TCP_USER_TIMEOUT_S * 1000)}


def connect(dsn: str) -> Any:
    """A plain autocommit connection for the control queries and the sweep."""
    with translated("connect"):
        conn = psycopg2.connect(dsn, connect_timeout=5, application_name="agentledger-relay",
                                **SILENCE)
        conn.autocommit = True
        return conn


def connect_replication(dsn: str) -> Any:
    """A logical replication connection (walsender protocol)."""
    with translated("connect for replication"):
        return psycopg2.connect(
            dsn,
            connection_factory=psycopg2.extras.LogicalReplicationConnection,
            connect_timeout=5,
            application_name="agentledger-relay",
            **SILENCE,
        )


def _one(conn: Any, name: str, **params: object) -> tuple[Any, ...] | None:
    with translated(name), conn.cursor() as cur:
        cur.execute(_QUERIES[name], params)
        row = cur.fetchone()
        return tuple(row) if row is not None else None


def slot_exists(conn: Any, slot: str) -> bool:
    """Whether the slot exists in this database.

    Raises:
        RelayError: the slot exists with another output plugin.
    """
    row = _one(conn, "slot_info", slot=slot)
    if row is not None and row[0] != "pgoutput":
        raise errors.RelayError("replication slot uses another output plugin", slot=slot,
                                plugin=row[0])
    return row is not None


def require_slot(slot: str) -> errors.SlotMissing:
    """The error for a missing slot the relay may not create."""
    return errors.SlotMissing(
        f"replication slot {slot!r} does not exist; create it "
        f"(SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')) or set "
        "AGENTLEDGER_RELAY_CREATE_SLOT=true",
        slot=slot,
    )


def create_slot(repl_cursor: Any, slot: str) -> tuple[int, str] | None:
    """Create the pgoutput slot and export its snapshot; ``None`` if it already exists.

    Returns ``(consistent_point, snapshot_name)``: rows committed before the consistent
    point are visible in the snapshot and never streamed; later ones are streamed. The
    snapshot lives until the next command on this replication connection.
    """
    if not _SLOT_NAME.fullmatch(slot):
        raise errors.RelayError("unusable slot name", slot=slot)
    try:
        with translated("create_replication_slot"):
            # Replication commands take no bound parameters; the name is validated above.
            repl_cursor.execute(f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput EXPORT_SNAPSHOT")
            _name, consistent_point, snapshot, _plugin = repl_cursor.fetchone()
    except errors.ReplicationLost as exc:
        # Two relays starting at once: the other one created it.
        if isinstance(exc.__cause__, psycopg2.errors.DuplicateObject):
            return None
        raise
    log.info("event=relay.slot_created slot=%s consistent_point=%s", slot, consistent_point)
    return parse_lsn(consistent_point), str(snapshot)


def snapshot_rows(conn: Any, snapshot: str) -> list[tuple[str, dict[str, str | None]]]:
    """The outbox rows committed before the slot existed, as ``(table, row)``, oldest first."""
    with translated("snapshot_outbox"):
        conn.autocommit = False
        try:
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("SET TRANSACTION SNAPSHOT %(snapshot)s", {"snapshot": snapshot})
                cur.execute(_QUERIES["snapshot_outbox"])
                names = [d[0] for d in cur.description]
                rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
            conn.commit()
        finally:
            if not conn.closed:
                conn.rollback()
                conn.autocommit = True
    return [(str(r.pop("source")), {k: _text(v) for k, v in r.items()}) for r in rows]


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` to an integer LSN."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def check_publication(conn: Any, publication: str) -> None:
    """Refuse to stream from a publication that misses inserts of an outbox table.

    Raises:
        PublicationMissing: absent, not publishing inserts, or without both outboxes.
    """
    with translated("publication_tables"), conn.cursor() as cur:
        cur.execute(_QUERIES["publication_tables"], {"publication": publication})
        rows = cur.fetchall()
    if not rows:
        raise errors.PublicationMissing(f"publication {publication!r} does not exist")
    tables = {name for _, _, name in rows if name}
    if not rows[0][0] or not OUTBOX_TABLES <= tables:
        raise errors.PublicationMissing(
            f"publication {publication!r} must publish inserts of {sorted(OUTBOX_TABLES)}",
            tables=sorted(tables),
        )


# Is the transaction with this 32-bit xid visible to a new snapshot? (migration 0018)
_VISIBLE = "SELECT agentledger_xid_visible(%(xid)s)"
# The same question for every transaction of one read pass, asked once: prepared on the
# control connection when a session starts (``prepare``), so each pass pays one round trip
# and no parse or plan. Answers the xids that are NOT visible yet (normally none).
_PREPARE_INVISIBLE = ("PREPARE agentledger_relay_invisible(bigint[]) AS "
                      "SELECT x FROM unnest($1) AS x WHERE NOT agentledger_xid_visible(x)")
_INVISIBLE = "EXECUTE agentledger_relay_invisible(%(xids)s::bigint[])"


def prepare(conn: Any) -> None:
    """Prepare the session's statements on its control connection (once per connection)."""
    with translated("prepare"), conn.cursor() as cur:
        cur.execute(_PREPARE_INVISIBLE)


def visible(conn: Any, xid: int) -> bool:
    """Whether transaction ``xid`` (32-bit, as pgoutput sends it) is visible to other sessions.

    Logical decoding streams a transaction once its commit record is flushed — before the
    commit is visible when it waits for a synchronous standby (``RecordTransactionCommit``
    flushes, then waits while the transaction still shows as running). Publishing it then
    lets an executor miss its row, and sweeping it deletes nothing (issue 18).
    """
    with translated("visibility"), conn.cursor() as cur:
        cur.execute(_VISIBLE, {"xid": xid})
        row = cur.fetchone()
    return bool(row and row[0])


def invisible(conn: Any, xids: Sequence[int]) -> set[int]:
    """Which of ``xids`` other sessions cannot see yet (see ``visible``), in one round trip.

    Needs ``prepare`` on ``conn`` first.
    """
    with translated("visibility"), conn.cursor() as cur:
        cur.execute(_INVISIBLE, {"xids": list(xids)})
        return {int(row[0]) for row in cur.fetchall()}


def left(conn: Any, rows: Sequence[tuple[str, str]]) -> int:
    """How many of these outbox rows still exist (after a sweep that deleted fewer)."""
    queries = {routing.COMMAND_TABLE: _QUERIES["left_command_outbox"],
               routing.EVENT_TABLE: _QUERIES["left_event_outbox"]}
    by_table: dict[str, list[str]] = {}
    for table, event_id in rows:
        if table in queries:
            by_table.setdefault(table, []).append(event_id)
    found = 0
    with translated("sweep_check"), conn.cursor() as cur:
        for table, ids in by_table.items():
            cur.execute(queries[table], {"ids": ids})
            found += int((cur.fetchone() or (0,))[0])
    return found


def sweep(conn: Any, rows: Sequence[tuple[str, str]]) -> int:
    """Delete published outbox rows by event id, in one transaction; returns rows deleted."""
    by_table: dict[str, list[str]] = {}
    for table, event_id in rows:
        if table in _SWEEP:
            by_table.setdefault(table, []).append(event_id)
    deleted = 0
    with translated("sweep"):
        conn.autocommit = False
        try:
            with conn.cursor() as cur:
                for table, ids in by_table.items():
                    cur.execute(_SWEEP[table], {"ids": ids})
                    deleted += cur.rowcount
            conn.commit()
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise
        finally:
            if not conn.closed:
                conn.autocommit = True
    return deleted


def retained_wal_bytes(conn: Any, slot: str) -> int | None:
    """WAL the slot retains, in bytes; ``None`` when the slot is gone."""
    row = _one(conn, "retained_wal", slot=slot)
    return int(row[0]) if row is not None and row[0] is not None else None


def drop_slot(conn: Any, slot: str) -> None:
    """Drop the slot if it exists (it must not be streaming)."""
    _one(conn, "drop_slot", slot=slot)


def stale_rows(
    conn: Any, *, age_s: float, after: tuple[Any, str, str] | None, limit: int
) -> list[tuple[str, dict[str, str | None], tuple[Any, str, str]]]:
    """Outbox rows older than ``age_s`` after the keyset ``after``, oldest first.

    Returns ``(table, row, position)``; the last position is the next call's ``after``.
    """
    at, source, event_id = after if after is not None else (None, "", "")
    with translated("stale_outbox"), conn.cursor() as cur:
        cur.execute(_QUERIES["stale_outbox"], {
            "age": age_s, "after_at": at, "after_source": source, "after_id": event_id,
            "limit": limit})
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    found = []
    for r in rows:
        table, created = str(r.pop("source")), r.pop("created_at")
        found.append((table, {k: _text(v) for k, v in r.items()}, (created, table, str(r["id"]))))
    return found
