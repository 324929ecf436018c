"""Apply ``migrations/NNNN_description.sql`` files in order.

One runner for every environment: it takes a session advisory lock (two runners never
interleave), records each applied file with a SHA-256 checksum, applies each file in its own
transaction, and refuses to go on when an applied file has changed since it was applied.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from agentledger import errors

# Arbitrary but fixed: every runner of every version must contend on the same lock key.
_LOCK_KEY = 0x6167_6C65_6467  # "agledg"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS agentledger_migrations (
  version integer PRIMARY KEY,
  name text NOT NULL,
  checksum text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    """One migration file."""

    version: int
    name: str
    path: Path

    @property
    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def discover(directory: Path) -> list[Migration]:
    """List the migrations of a directory in version order.

    Raises:
        MigrationError: on a badly named file or a repeated or missing version number.
    """
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.match(path.name)
        if not match:
            raise errors.MigrationError(f"bad migration file name: {path.name}")
        found.append(Migration(int(match[1]), match[2], path))
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise errors.MigrationError(
                f"migration versions must run 1, 2, 3...; found {migration.path.name} "
                f"where version {expected:04d} was expected"
            )
    return found


async def migrate(dsn: str, directory: Path) -> list[Migration]:
    """Bring the database at ``dsn`` up to date.

    Returns:
        The migrations applied by this call (empty when already up to date).

    Raises:
        MigrationError: an applied file changed, or a migration failed (its transaction is
            rolled back; earlier ones stay applied).
    """
    pending = discover(directory)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
        try:
            await conn.execute(_BOOKKEEPING)
            applied = {
                row["version"]: row["checksum"]
                for row in await conn.fetch("SELECT version, checksum FROM agentledger_migrations")
            }
            done: list[Migration] = []
            for migration in pending:
                if migration.version in applied:
                    if applied[migration.version] != migration.checksum:
                        raise errors.MigrationError(
                            f"{migration.path.name} changed after it was applied; "
                            "add a new migration instead of editing an applied one",
                            version=migration.version,
                        )
                    continue
                try:
                    async with conn.transaction():
                        await conn.execute(migration.sql)
                        await conn.execute(
                            "INSERT INTO agentledger_migrations (version, name, checksum) "
                            "VALUES ($1, $2, $3)",
                            migration.version, migration.name, migration.checksum,
                        )
                except asyncpg.PostgresError as exc:
                    raise errors.MigrationError(
                        f"{migration.path.name} failed: {exc}", version=migration.version
                    ) from exc
                done.append(migration)
            return done
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
    finally:
        await conn.close()


async def applied_versions(dsn: str) -> list[tuple[int, str, str]]:
    """The applied migrations as ``(version, name, checksum)``, oldest first."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT version, name, checksum FROM agentledger_migrations ORDER BY version"
        )
    finally:
        await conn.close()
    return [(r["version"], r["name"], r["checksum"]) for r in rows]
