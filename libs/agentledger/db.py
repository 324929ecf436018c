"""Connections and pools the way every agentledger process opens them.

Each service (and the CLI) used to build its asyncpg pool by hand, with the role switched by
an f-string ``SET ROLE "{role}"``: a role name from configuration went into SQL unchecked,
and each copy chose its own subset of the pool settings. One helper validates the role name
and applies the same three settings everywhere; :func:`connect` does the same for a single
connection (the CLI, the demo, the test pipeline), so no caller writes ``SET ROLE`` itself.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from agentledger import errors
from agentledger.ledger import repository

# A PostgreSQL role name we are willing to put into SQL: an unquoted-style identifier, at
# most 63 bytes (NAMEDATALEN - 1). SET ROLE takes no bind parameter, so the name is
# validated here and quoted, never escaped.
ROLE_PATTERN: Final = r"^[a-z_][a-z0-9_]{0,62}$"
_ROLE = re.compile(ROLE_PATTERN)


def role_name(role: str) -> str:
    """``role`` if it is a plain role identifier.

    Raises:
        errors.ConfigurationError: Anything else (quotes, spaces, upper case, too long).
    """
    if not _ROLE.fullmatch(role):
        raise errors.ConfigurationError(
            f"database role {role[:64]!r} is not a plain identifier ({ROLE_PATTERN})")
    return role


def set_role_sql(role: str) -> str:
    """The ``SET ROLE`` statement for a validated ``role`` (see :func:`role_name`)."""
    return f'SET ROLE "{role_name(role)}"'


def with_database(url: str, name: str) -> str:
    """``url`` (same server, same credentials) pointing at database ``name``.

    Scratch, template and per-test databases are created through an administrative URL and
    then used through this one.
    """
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


async def connect(url: str, *, role: str | None = None) -> asyncpg.Connection:
    """One connection acting as ``role``: the single-connection face of :func:`create_pool`.

    Args:
        url: The PostgreSQL URL.
        role: The group role to switch to, or ``None`` when the login already is it.

    Raises:
        errors.ConfigurationError: ``role`` is not a plain identifier (checked before any
            connection is made).
    """
    statement = set_role_sql(role) if role else None
    conn: asyncpg.Connection = await asyncpg.connect(url)
    if statement is not None:
        try:
            await conn.execute(statement)
        except BaseException:
            # The caller never gets the connection, so nobody else can close it. terminate()
            # is synchronous: it cannot hang on a dead server nor be cancelled half-way.
            conn.terminate()
            raise
    return conn


# asyncpg decodes text[] natively but learns every other array type from the server, once
# per connection, the first time a statement binds it: a catalog query (and a JIT setting
# round trip) in the middle of whatever that connection does first — under load, in a burst.
# A pool's connection learns the array types the ledger's set-based statements bind
# (``ledger/*.sql``) when it opens instead: one introspection, at start (issue 41).
_HOT_ARRAY_TYPES: Final = ("SELECT $1::uuid[], $2::jsonb[], $3::bytea[], $4::timestamptz[], "
                           "$5::int[], $6::float8[], $7::bigint[]")


async def create_pool(
    url: str, *, role: str | None, size: int, min_size: int = 1, **options: Any
) -> asyncpg.Pool:
    """An asyncpg pool whose connections act as ``role``.

    Every connection gets :func:`repository.bound_silence` (a silent network fails a
    statement instead of hanging it), then ``SET ROLE`` when ``role`` is given, then learns
    the hot path's array types (``_HOT_ARRAY_TYPES``); the pool keeps sessions on release
    (:func:`repository.keep_session`).

    Args:
        url: The PostgreSQL URL.
        role: The group role to switch to, or ``None`` when the login already is it.
        size: The most connections the pool opens.
        min_size: Connections opened at once (0: start while the database is away).
        options: Further ``asyncpg.create_pool`` options (``command_timeout``, ...).

    Raises:
        errors.ConfigurationError: ``role`` is not a plain identifier (checked before any
            connection is made).
    """
    statement = set_role_sql(role) if role else None

    async def init(conn: asyncpg.Connection) -> None:
        repository.bound_silence(conn)
        if statement is not None:
            await conn.execute(statement)
        await conn.prepare(_HOT_ARRAY_TYPES)  # learns the types; the statement is not kept

    pool: asyncpg.Pool = await asyncpg.create_pool(
        url, min_size=min_size, max_size=size, init=init, reset=repository.keep_session,
        **options)
    return pool
