"""A synchronous standby that does not exist: commits that wait for it park flushed,
decodable by logical replication, and invisible to other sessions (issue 18's reproduction).

``ghost_standby(url, every_session=False)``: only sessions that ``SET synchronous_commit = on``
wait; with ``every_session`` every commit of the cluster does. Leaving the block restores the
configuration, which also releases every parked commit (PostgreSQL wakes the waiters when
synchronous replication is turned off)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg2

from agentledger.testing.polling import wait_until

GHOST = "agentledger_ghost_standby"


def _apply(url: str, statements: list[str], expect: str) -> None:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
            cur.execute("SELECT pg_reload_conf()")
    finally:
        conn.close()

    def applied() -> bool:
        probe = psycopg2.connect(url)
        try:
            with probe.cursor() as cur:
                cur.execute("SHOW synchronous_standby_names")
                return (cur.fetchone() or ("",))[0] == expect
        finally:
            probe.close()
    assert wait_until(applied, timeout=30), "the configuration reload was not applied"


@contextmanager
def ghost_standby(url: str, *, every_session: bool = False) -> Iterator[None]:
    commit = "on" if every_session else "local"
    _apply(url, [f"ALTER SYSTEM SET synchronous_commit = '{commit}'",
                 f"ALTER SYSTEM SET synchronous_standby_names = '{GHOST}'"], GHOST)
    try:
        yield
    finally:
        release(url)


def release(url: str) -> None:
    """Back to no synchronous standby: every parked commit completes."""
    _apply(url, ["ALTER SYSTEM RESET synchronous_standby_names",
                 "ALTER SYSTEM RESET synchronous_commit"], "")


def log_since(log: Path, offset: int) -> list[str]:
    """The lines a service wrote to ``log`` after byte ``offset`` (its size at some moment)."""
    with log.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").splitlines()


def _xids(lines: list[str], event: str) -> set[str]:
    """The xids a relay line names: ``xids=1,2,3`` (one read pass's, since issue 41)."""
    return {xid for line in lines if f"event={event} " in line
            for w in line.split() if w.startswith("xids=")
            for xid in w.split("=", 1)[1].split(",") if xid}


def relay_holds(log: Path, offset: int) -> set[str]:
    """Transactions the relay decoded (their commit is flushed) and still waits to see: a
    ``relay.visibility_wait`` after ``offset`` with no ``relay.visible`` yet."""
    lines = log_since(log, offset)
    return _xids(lines, "relay.visibility_wait") - _xids(lines, "relay.visible")

